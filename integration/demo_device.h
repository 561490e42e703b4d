/* demo_device.h: where the demo engine keeps its tensors: host memory for
 * the host backend, CUDA device memory (with host copies for the experts
 * and the checks) for the nccl backend. */
#ifndef MOE_EP_DEMO_DEVICE_H_
#define MOE_EP_DEMO_DEVICE_H_

#include <stddef.h>

typedef struct demo_buf {
  void *host;
  void *dev; /* == host on the host backend */
  size_t bytes;
} demo_buf_t;

/* gpu: also allocate a device twin on the current device. 0 on failure. */
int demo_buf_alloc(demo_buf_t *b, size_t bytes, int gpu);
void demo_buf_free(demo_buf_t *b);
int demo_upload(demo_buf_t *b);   /* waits for the device first */
int demo_download(demo_buf_t *b); /* waits for the device first */
int demo_set_device(int device);  /* 0 on failure */
const char *demo_device_error(void);

#endif /* MOE_EP_DEMO_DEVICE_H_ */

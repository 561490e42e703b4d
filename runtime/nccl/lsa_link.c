/* lsa_link.c: NVLink or PCIe between LSA peers (see lsa_link.h). NVML is
 * opened with dlopen once per process; its few types are declared here
 * with NVML's layout (nvml.h is not among the build's headers). */
#define _GNU_SOURCE /* gethostname */
#include "runtime/nccl/lsa_link.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/error.h"

/* NVML's ABI: return codes are ints (0 = success), devices are opaque. */
typedef struct mep_nvml_device *mep_nvml_device_t;
enum { MEP_NVML_P2P_CAPS_INDEX_NVLINK = 2, MEP_NVML_P2P_STATUS_OK = 0 };

static struct {
  int ok; /* NVML opened and initialised */
  int (*get_handle_by_bus)(const char *bus, mep_nvml_device_t *dev);
  int (*get_p2p_status)(mep_nvml_device_t a, mep_nvml_device_t b, int caps, int *status);
} nvml;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

/* Kept open for the process: NVML's own state outlives any one group. */
static void nvml_open(void) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) return;
  int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
  nvml.get_handle_by_bus = (int (*)(const char *, mep_nvml_device_t *))dlsym(
      lib, "nvmlDeviceGetHandleByPciBusId_v2");
  nvml.get_p2p_status = (int (*)(mep_nvml_device_t, mep_nvml_device_t, int, int *))dlsym(
      lib, "nvmlDeviceGetP2PStatus");
  if (init == NULL || nvml.get_handle_by_bus == NULL || nvml.get_p2p_status == NULL) return;
  nvml.ok = init() == 0;
}

/* The policy a value names; 0 for none of them (nothing set). */
static int policy_of(const char *value, mep_lsa_link_policy_t *out) {
  if (value == NULL || value[0] == '\0' || strcmp(value, "detect") == 0)
    *out = MEP_LSA_LINK_DETECT;
  else if (strcmp(value, "nvlink") == 0)
    *out = MEP_LSA_LINK_ASSUME_NVLINK;
  else if (strcmp(value, "pcie") == 0)
    *out = MEP_LSA_LINK_ASSUME_PCIE;
  else
    return 0;
  return 1;
}

moe_ep_status_t mep_lsa_link_policy_parse(const char *value, mep_lsa_link_policy_t *out) {
  if (!policy_of(value, out))
    return mep_error(MOE_EP_ERR_INVALID_ARGUMENT,
                     "MOE_EP_LSA_LINK is '%.64s'; it must be detect, nvlink or pcie", value);
  return MOE_EP_OK;
}

moe_ep_status_t mep_lsa_link_policy_env(mep_lsa_link_policy_t *out) {
  return mep_lsa_link_policy_parse(getenv("MOE_EP_LSA_LINK"), out);
}

int mep_lsa_link_env_is_pcie(void) {
  mep_lsa_link_policy_t p;
  return policy_of(getenv("MOE_EP_LSA_LINK"), &p) && p == MEP_LSA_LINK_ASSUME_PCIE;
}

/* The first line of a small file, without its newline; 0 if unreadable. */
static int read_line(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  const int ok = fgets(buf, (int)len, f) != NULL;
  fclose(f);
  if (!ok) return 0;
  buf[strcspn(buf, "\n")] = '\0';
  return buf[0] != '\0';
}

void mep_lsa_gpu_describe(const char *bus, mep_lsa_gpu_t *out) {
  memset(out, 0, sizeof *out);
  /* the boot id tells machines apart even where hostnames repeat
   * (containers) */
  if (!read_line("/proc/sys/kernel/random/boot_id", out->host, sizeof out->host) &&
      gethostname(out->host, sizeof out->host - 1) != 0)
    out->host[0] = '\0';
  snprintf(out->bus, sizeof out->bus, "%s", bus != NULL ? bus : "");
}

mep_lsa_link_t mep_lsa_link_between(const mep_lsa_gpu_t *self, const mep_lsa_gpu_t *peer,
                                    mep_lsa_link_policy_t policy) {
  if (policy == MEP_LSA_LINK_ASSUME_NVLINK) return MEP_LSA_LINK_NVLINK;
  if (policy == MEP_LSA_LINK_ASSUME_PCIE) return MEP_LSA_LINK_PCIE;
  if (self->host[0] == '\0' || peer->host[0] == '\0') return MEP_LSA_LINK_UNKNOWN;
  /* load/store across machines is only multi-node NVLink */
  if (strcmp(self->host, peer->host) != 0) return MEP_LSA_LINK_NVLINK;
  if (strcmp(self->bus, peer->bus) == 0) return MEP_LSA_LINK_NVLINK; /* one GPU */
  pthread_once(&nvml_once, nvml_open);
  if (!nvml.ok) return MEP_LSA_LINK_UNKNOWN;
  mep_nvml_device_t a, b;
  int status = -1;
  if (nvml.get_handle_by_bus(self->bus, &a) != 0 || nvml.get_handle_by_bus(peer->bus, &b) != 0 ||
      nvml.get_p2p_status(a, b, MEP_NVML_P2P_CAPS_INDEX_NVLINK, &status) != 0)
    return MEP_LSA_LINK_UNKNOWN;
  return status == MEP_NVML_P2P_STATUS_OK ? MEP_LSA_LINK_NVLINK : MEP_LSA_LINK_PCIE;
}

const char *mep_lsa_link_name(mep_lsa_link_t link) {
  return link == MEP_LSA_LINK_NVLINK ? "NVLink" : link == MEP_LSA_LINK_PCIE ? "PCIe" : "unknown";
}

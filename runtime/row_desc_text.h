/* row_desc_text.h: a row description (kernels/common/row_desc.h) as the
 * refusals of both backends name it: the host backend's count words and
 * the nccl kernels' carry the same description. No CUDA: CPU-tested. */
#ifndef MEP_ROW_DESC_TEXT_H_
#define MEP_ROW_DESC_TEXT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "hidden=H, top_k=K, bf16 rows" or "... fp8 rows with <format> scales". */
void mep_row_desc_text(uint32_t desc, char *out, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* MEP_ROW_DESC_TEXT_H_ */

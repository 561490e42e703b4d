/* row_desc_text.c: see row_desc_text.h. */
#include "runtime/row_desc_text.h"

#include <stdio.h>

#include "kernels/common/kernels_types.h"
#include "kernels/common/row_desc.h"

void mep_row_desc_text(uint32_t desc, char *out, size_t len) {
  const int mode = mep_row_desc_scale_mode(desc);
  if (mode < 0) {
    snprintf(out, len, "hidden=%d, top_k=%d, bf16 rows", mep_row_desc_hidden(desc),
             mep_row_desc_top_k(desc));
    return;
  }
  snprintf(out, len, "hidden=%d, top_k=%d, fp8 rows with %s scales", mep_row_desc_hidden(desc),
           mep_row_desc_top_k(desc),
           mode == MEP_FP8_SCALE_F32          ? "f32"
           : mode == MEP_FP8_SCALE_UE8M0      ? "power-of-two (UE8M0 in f32)"
           : mode == MEP_FP8_SCALE_PER_TOKEN  ? "per-token f32"
                                              : "packed UE8M0");
}

/* host_layout.c: region layout of the host backend (see host_layout.h). */
#include "runtime/host/host_layout.h"

#include "kernels/host/host_rows.h"
#include "runtime/config.h"

#define ALIGN64(x) (((x) + 63u) & ~(size_t)63u)

void mep_host_layout_init(mep_host_layout_t *l, const moe_ep_config_t *cfg,
                          int world) {
  int fp8 = mep_config_fp8_dispatch(cfg);
  size_t m = (size_t)cfg->max_tokens_per_rank;
  size_t k = (size_t)cfg->top_k;
  size_t w = (size_t)world;
  l->world = world;
  l->nsets = cfg->double_buffer ? 2 : 1;
  /* A slot holds the largest row of any call: HT groups size it for bf16
   * rows (fp8 is 0 there), which also holds a pre-quantised fp8 HT row of
   * the same hidden, its scales and metadata (hidden + hidden/32 bytes of
   * payload against 2 * hidden; tests/host/host_rows_test.cc checks it). */
  l->row_max = mep_row_bytes_max(cfg->hidden, cfg->top_k, fp8);
  /* LL combine returns one row per (token, k); HT one per (token, distinct
   * destination rank), at most min(top_k, world). */
  if (cfg->mode == MOE_EP_MODE_LOW_LATENCY) {
    l->combine_rows = m * k;
  } else {
    l->combine_rows = m * (k < w ? k : w);
  }
  l->combine_row_bytes = ALIGN64((size_t)cfg->hidden * 2u);
  l->dispatch_flags = 0;
  l->dispatch_counts = ALIGN64(w * 8u);
  l->combine_flags = l->dispatch_counts + ALIGN64(w * MEP_HOST_COUNT_BYTES);
  /* two halves of combine flags and rows (mep_host_combine_half) */
  l->combine_dispatches = l->combine_flags + 2u * ALIGN64(w * 8u);
  l->dispatch_refusals = l->combine_dispatches + 2u * ALIGN64(w * 8u);
  l->combine_refusals = l->dispatch_refusals + ALIGN64(w * 8u);
  l->dispatch_reads = l->combine_refusals + ALIGN64(w * 8u);
  l->dispatch_rows = l->dispatch_reads + ALIGN64(w * 8u);
  l->combine_area = l->dispatch_rows + ALIGN64(w * m * l->row_max);
  l->set_bytes = l->combine_area + 2u * l->combine_rows * l->combine_row_bytes;
}

int mep_host_combine_half(const mep_host_layout_t *l, uint64_t seq) {
  return (int)((seq / (uint64_t)l->nsets) & 1u);
}

size_t mep_host_layout_bytes(const mep_host_layout_t *l) {
  return (size_t)l->nsets * l->set_bytes;
}

size_t mep_host_off_dispatch_flag(const mep_host_layout_t *l, int set, int src) {
  return (size_t)set * l->set_bytes + l->dispatch_flags + (size_t)src * 8u;
}

size_t mep_host_off_dispatch_count(const mep_host_layout_t *l, int set, int src) {
  return (size_t)set * l->set_bytes + l->dispatch_counts + (size_t)src * MEP_HOST_COUNT_BYTES;
}

size_t mep_host_off_combine_flag(const mep_host_layout_t *l, int set, int half, int src) {
  return (size_t)set * l->set_bytes + l->combine_flags + (size_t)half * ALIGN64(l->world * 8u) +
         (size_t)src * 8u;
}

size_t mep_host_off_combine_dispatch(const mep_host_layout_t *l, int set, int half, int src) {
  return (size_t)set * l->set_bytes + l->combine_dispatches +
         (size_t)half * ALIGN64(l->world * 8u) + (size_t)src * 8u;
}

size_t mep_host_off_refusal(const mep_host_layout_t *l, int set, int combine, int src) {
  return (size_t)set * l->set_bytes + (combine ? l->combine_refusals : l->dispatch_refusals) +
         (size_t)src * 8u;
}

size_t mep_host_off_dispatch_read(const mep_host_layout_t *l, int set, int src) {
  return (size_t)set * l->set_bytes + l->dispatch_reads + (size_t)src * 8u;
}

/* Rows of one source use the op's row size, packed from the source's slot
 * start; the slot region is sized for the largest row. */
size_t mep_host_off_dispatch_row(const mep_host_layout_t *l, int set, int src,
                                 int max_tokens, int row, size_t row_bytes) {
  return (size_t)set * l->set_bytes + l->dispatch_rows +
         (size_t)src * (size_t)max_tokens * l->row_max + (size_t)row * row_bytes;
}

size_t mep_host_off_combine_row(const mep_host_layout_t *l, int set, int half, size_t row) {
  return (size_t)set * l->set_bytes + l->combine_area +
         ((size_t)half * l->combine_rows + row) * l->combine_row_bytes;
}

// fake_ctx.h: a kernel context (mep_ll_ctx_t or mep_ht_ctx_t) whose
// pointers are set but never followed, so the launchers' argument checks
// run to the end without a GPU.
#ifndef MEP_TESTS_KERNELS_FAKE_CTX_H_
#define MEP_TESTS_KERNELS_FAKE_CTX_H_

#include "kernels/common/error_record.h"

template <class Ctx>
void FillFakePointers(Ctx *c) {
  static char dummy[64];
  c->dev_comm = dummy;
  c->window = dummy;
  c->window_local = dummy;
  c->state = dummy;
  c->error_dev = reinterpret_cast<mep_error_record_t *>(dummy);
  c->lsa_base = 4096;  // resolved LSA addressing (any non-zero value)
}

#endif  // MEP_TESTS_KERNELS_FAKE_CTX_H_

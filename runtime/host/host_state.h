/* host_state.h: the host backend's per-group state, shared by its
 * protocol (host_backend.c) and the receive of a dispatch's rows
 * (host_dispatch_rows.c). */
#ifndef MEP_HOST_STATE_H_
#define MEP_HOST_STATE_H_

#include <stddef.h>
#include <stdint.h>

#include "kernels/host/host_rows.h"
#include "runtime/group.h"
#include "runtime/host/host_layout.h"
#include "runtime/host/host_mesh.h"
#include "runtime/nccl/layout_book.h"
#include "runtime/op.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct host_state {
  mep_host_mesh_t *mesh;
  mep_host_layout_t layout;
  uint8_t *staging;  /* one destination's rows */
  /* [R] stable sources of the row-count puts: per destination the count
   * word (row description << 32 | rows) and the prepare number of the
   * call (HT; 0 in LL). */
  uint64_t (*counts)[2];
  /* [R] each source's count word and prepare number of the dispatch being
   * received, read once (recv_half): a later operation's puts may land in
   * the region while it is read, so every use reads this copy. */
  uint64_t (*recv_words)[2];
  /* HT count exchanges this rank has joined (prepare_no of the latest). */
  uint64_t exchanges;
  mep_layout_book_t book; /* which dispatch's layout each buffer set holds */
  /* seq + 1 of the last combine whose receive was abandoned, until this
   * rank's next send has waited for every peer to reach it (0: none). */
  uint64_t owed;
  /* Per buffer set and kind (dispatch, combine): seq + 1 of this rank's
   * refusal in that word that a peer may not have read yet, 0 when every
   * peer is past it (host_op_refused). */
  uint64_t refusal_unread[MEP_NUM_BUFFER_SETS][2];
  /* Per dispatch buffer set: the combine this rank sent of the set's last
   * dispatch (its operation and set), and whether this rank has received
   * it. A peer signals that combine only after receiving the dispatch, so
   * a dispatch reusing the set waits for those signals while this rank's
   * receive of the combine is still to run (wait_reuse). */
  struct {
    uint64_t comb_seq;
    int32_t comb_set;
    int32_t sent;
    int32_t received;
  } reuse[MEP_NUM_BUFFER_SETS];
  /* Per buffer set: seq + 1 of this rank's last dispatch sent into it (0:
   * none), whose rows every peer must have read before the set's next
   * dispatch overwrites them (wait_read). */
  uint64_t read_due[MEP_NUM_BUFFER_SETS];
} host_state_t;

/* host_dispatch_rows.c */
/* Bytes of one token's fp8 scales: f32 per 128 channels, or packed UE8M0
 * words (LL receive and HT rows alike). */
size_t mep_host_scale_row_bytes(const mep_op_t *op);
/* The layout of one row of op's dispatch. */
void mep_host_row_layout(const mep_op_t *op, mep_row_layout_t *rl);
/* What one call's rows look like, sent in the upper half of each count
 * word (check_descs). */
uint32_t mep_host_row_desc(const mep_op_t *op);
/* Rows of one token's combine: one per slot (LL), one per distinct
 * destination rank (HT); a dispatch row's ordinal indexes them. */
int mep_host_combine_width(const moe_ep_group_t *g, const mep_op_t *op);
/* Once every source's signal of dispatch op is in: checks the sources'
 * row formats and rows, then fans the rows out into op's outputs and a
 * slot table for the handle (LL: by local expert; HT: packed). */
moe_ep_status_t mep_host_dispatch_read(moe_ep_group_t *g, mep_op_t *op);

#ifdef __cplusplus
}
#endif

#endif /* MEP_HOST_STATE_H_ */

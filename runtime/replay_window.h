/* replay_window.h: which message numbers a receiver has taken from one
 * sender, so that each is taken once: the highest taken and a 64-bit mask
 * of the 64 below it. Numbers start at 1 and may arrive a little out of
 * order (UCX's lanes); one 64 or more below the highest is too old to
 * tell and is refused. Used by the bootstrap's connections and the host
 * mesh's sources alike. */
#ifndef MEP_RUNTIME_REPLAY_WINDOW_H_
#define MEP_RUNTIME_REPLAY_WINDOW_H_

#include <stdint.h>

#define MEP_REPLAY_WINDOW 64

/* 1 when n is new, 0 for a replay, a zero n, or one too old to tell;
 * nothing is recorded. */
static inline int mep_replay_fresh(uint64_t top, uint64_t seen, uint64_t n) {
  if (n == 0) return 0;
  if (n > top) return 1;
  const uint64_t back = top - n;
  return back < MEP_REPLAY_WINDOW && (seen >> back & 1) == 0;
}

/* 1 when n is new (then recorded), 0 for a replay, a zero n, or one too
 * old to tell. */
static inline int mep_replay_take(uint64_t *top, uint64_t *seen, uint64_t n) {
  if (!mep_replay_fresh(*top, *seen, n)) return 0;
  if (n > *top) {
    const uint64_t shift = n - *top;
    *seen = shift >= MEP_REPLAY_WINDOW ? 0 : *seen << shift;
    *seen |= 1;
    *top = n;
    return 1;
  }
  *seen |= (uint64_t)1 << (*top - n);
  return 1;
}

#endif /* MEP_RUNTIME_REPLAY_WINDOW_H_ */

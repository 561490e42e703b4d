// gate_records.h: what the tests that speak the gate's records
// (bootstrap_knocker, bootstrap_forger, the fake gate) build from the
// record layout alone: a record's header.
#ifndef MEP_TESTS_BOOTSTRAP_GATE_RECORDS_H_
#define MEP_TESTS_BOOTSTRAP_GATE_RECORDS_H_

#include <string.h>

#include "runtime/bootstrap_types.h"

namespace mep_test {

// A header of `type` naming `rank` of `world`, lengths zero.
inline mep_bs_knock_hdr_t GateHeader(int type, int rank, int world) {
  mep_bs_knock_hdr_t h;
  memset(&h, 0, sizeof(h));
  h.magic = MEP_BS_KNOCK_MAGIC;
  h.version = MEP_BS_VERSION;
  h.type = (uint16_t)type;
  h.rank = rank;
  h.world_size = world;
  return h;
}

}  // namespace mep_test

#endif  // MEP_TESTS_BOOTSTRAP_GATE_RECORDS_H_

// config_fuzz.cc: libFuzzer target for the YAML reader: any bytes must give
// OK (then freed) or a status with a message, never a crash, hang or leak.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/config.h"
#include "runtime/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // NUL-terminated copy: the entry takes a C string. A leading "moe_ep:"-free
  // input without ':' or '\n' is read as a path; prefix a newline so every
  // input is exercised as YAML text, which is what engines send.
  char *text = static_cast<char *>(malloc(size + 2));
  if (text == nullptr) return 0;
  text[0] = '\n';
  memcpy(text + 1, data, size);
  text[size + 1] = '\0';
  moe_ep_config_t *cfg = nullptr;
  moe_ep_status_t st = mep_config_from_yaml(text, &cfg);
  if (st == MOE_EP_OK) {
    if (cfg == nullptr || mep_config_validate(cfg) != MOE_EP_OK) abort();
    char canon[2048];
    mep_config_canonical(cfg, canon, sizeof(canon));
    mep_config_hash(cfg);
    mep_config_free(cfg);
  } else if (cfg != nullptr || mep_last_error()[0] == '\0') {
    abort();  // failure must allocate nothing and say why
  }
  free(text);
  return 0;
}

/* pin_library.c: see pin_library.h. dlopen(RTLD_NOLOAD | RTLD_NODELETE) of
 * the object that holds this function marks it never to be unloaded. */
#define _GNU_SOURCE
#include "runtime/pin_library.h"

#include <dlfcn.h>
#include <pthread.h>

static pthread_once_t pinned = PTHREAD_ONCE_INIT;

static void pin(void) {
  Dl_info info;
  if (dladdr((void *)&pin, &info) != 0 && info.dli_fname != NULL)
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

void mep_pin_library(void) { pthread_once(&pinned, pin); }

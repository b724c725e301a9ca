/* C code of a Rust crate, built against the header mps-client-c exposes. */
#include <mps.h>

const char *not_ready_text(void) { return mps_status_string(MPS_ERROR_NOT_READY); }

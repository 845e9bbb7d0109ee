#include "fedmoe/status.h"

const char *fm_status_str(fm_status s)
{
    switch (s) {
    case FM_OK: return "ok";
    case FM_ERR_ARG: return "bad argument";
    case FM_ERR_NOMEM: return "out of memory";
    case FM_ERR_IO: return "i/o error";
    case FM_ERR_FORMAT: return "bad format";
    case FM_ERR_STATE: return "bad state";
    }
    return "unknown status";
}

/* status.h - the one status code every fedmoe action returns. */
#ifndef FEDMOE_STATUS_H
#define FEDMOE_STATUS_H

typedef enum {
    FM_OK = 0,
    FM_ERR_ARG,      /* a bad argument or configuration value */
    FM_ERR_NOMEM,    /* an allocation failed */
    FM_ERR_IO,       /* a file could not be opened, read or written */
    FM_ERR_FORMAT,   /* input that is truncated, corrupt or mismatched */
    FM_ERR_STATE,    /* an action that is not valid now */
} fm_status;

/* A static, human-readable name for a status. Never NULL. */
const char *fm_status_str(fm_status s);

#endif

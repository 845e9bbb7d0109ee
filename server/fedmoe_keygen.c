/* fedmoe-keygen: makes CURVE key pairs for the coordinator and its clients. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fedmoe/keys.h"
#include "fedmoe/log.h"

static const char usage[] =
    "usage: fedmoe-keygen [--out DIR] ID...\n"
    "\n"
    "Makes one CURVE key pair per ID (a client id, or e.g. 'coordinator'): DIR/ID.key\n"
    "holds the pair (mode 0600; give it to that program's --key and keep it secret),\n"
    "DIR/ID.pub the public half. A coordinator admits the clients whose .pub files are in\n"
    "its --allow folder; a client pins the coordinator's .pub with --server-key. Existing\n"
    "files are never overwritten. DIR (default .) is created, mode 0700, if missing.\n"
    "\n"
    "  --out DIR    where to write the files (default .)\n"
    "  -h, --help   this text\n";

int main(int argc, char **argv)
{
    const char *out = ".";
    int first = 1;
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (!strcmp(argv[first], "-h") || !strcmp(argv[first], "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(argv[first], "--out") && first + 1 < argc) {
            out = argv[++first];
            continue;
        }
        fprintf(stderr, "fedmoe-keygen: unknown or incomplete option %s (see --help)\n", argv[first]);
        return 2;
    }
    if (first == argc) {
        fprintf(stderr, "fedmoe-keygen: give at least one ID (see --help)\n");
        return 2;
    }
    if (mkdir(out, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "fedmoe-keygen: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    for (int i = first; i < argc; i++) {
        fm_key_t k;
        fm_status st = fm_key_generate(&k, argv[i]);
        if (st == FM_OK)
            st = fm_key_write(&k, out);
        if (st != FM_OK) {
            fprintf(stderr, "fedmoe-keygen: %s\n", fm_error_last());
            return st == FM_ERR_ARG ? 2 : 1;
        }
        printf("%s/%s.key  %s/%s.pub  public %s\n", out, k.id, out, k.id, k.public_z85);
    }
    return 0;
}

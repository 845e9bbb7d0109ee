#include "fedmoe/spawn.h"

#include <fcntl.h>
#include <spawn.h>
#include <string.h>

#include "fedmoe/log.h"

extern char **environ;

pid_t fm_spawn_logged(char *const argv[], const char *log, bool append)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fm_error_set("cannot start %s: %s", argv[0], strerror(rc));
        return -1;
    }
    return pid;
}

/* spawn.h - starting a program with its output in a log file. */
#ifndef FEDMOE_SPAWN_H
#define FEDMOE_SPAWN_H

#include <stdbool.h>
#include <sys/types.h>

/* Starts argv[0] (a path, not searched) with argv, standard output and error
 * both going to the file log (created 0644; appended to with append, else
 * truncated). Returns the child's pid (the caller waits for it), or -1 with a
 * reason in fm_error_last. */
pid_t fm_spawn_logged(char *const argv[], const char *log, bool append);

#endif

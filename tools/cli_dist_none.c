/* tools/cli_dist.h in a build without MPI: always one process (rank 0 of 1). */
#include <unistd.h>

#include "cli_dist.h"

bool cli_dist_terminal(const cli_dist *d)
{
    (void)d;
    return isatty(2);
}

int cli_dist_begin(cli_dist *d, const char *cmd)
{
    *d = (cli_dist){ .cmd = cmd, .rank = 0, .size = 1 };
    return 0;
}

void cli_dist_end(cli_dist *d)
{
    (void)d;
}

int cli_dist_agree(cli_dist *d, int rc)
{
    (void)d;
    return rc;
}

void cli_dist_notify(cli_dist *d)
{
    (void)d;
}

bool cli_dist_peer_failed(cli_dist *d)
{
    (void)d;
    return false;
}

int cli_dist_reduce_session(cli_dist *d, qcal_calib_session *s)
{
    (void)d;
    (void)s;
    return 0;
}

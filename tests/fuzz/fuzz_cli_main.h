/* Force-included (-include) into the CLI sources built for fuzz_cli_args, whose main is
 * renamed to qcal_cli_main by -Dmain=qcal_cli_main: its prototype, for
 * -Werror=missing-prototypes. */
#ifndef QCAL_FUZZ_CLI_MAIN_H
#define QCAL_FUZZ_CLI_MAIN_H
int qcal_cli_main(int argc, char **argv);
#endif

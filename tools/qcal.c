/* TEMPORARY skeleton: the CLI helper replaces this file. */
#include <stdio.h>
#include "tools/cli.h"
int main(int argc, char **argv) { (void)argc; (void)argv; puts(qcal_version()); return 0; }

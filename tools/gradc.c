/* gradc.c - the command line. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--version") == 0) {
    printf("gradc %s\n", GRADC_VERSION);
    return 0;
  }
  fprintf(stderr, "gradc: error: no command given (see gradc --help)\n");
  return 1;
}

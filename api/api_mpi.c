/* api_mpi.c - gradc_mpi_enable (include/gradc.h): runs of more than one
 * rank go over MPI (runtime/comm/comm_mpi.c).  A file of its own, so that
 * only a program that calls it links the MPI back end and libmpi. */
#include "api/api_impl.h"
#include "runtime/comm/comm.h"

gradc_status gradc_mpi_enable(void) {
#ifdef GRADC_HAVE_MPI
  comm_register(&comm_mpi_backend);
  return GRADC_OK;
#else
  return api_fail(GRADC_ERR_USER, "gradc: error: this build has no MPI (configure with -DGRADC_MPI=ON and "
                                  "libopenmpi-dev installed)");
#endif
}

/* slice.c - Python's slice.indices for one axis, the one definition of
 * basic slicing that the frontend, the interpreter, the kernel model and
 * the code generators follow. */
#include "support.h"

int64_t slice_indices(int64_t dim, int64_t *start, int64_t stop, int64_t step) {
  int64_t s = *start;
  if (step > 0) {
    if (s < 0) s += dim;
    if (s < 0) s = 0;
    if (s > dim) s = dim;
    if (stop < 0) stop += dim;
    if (stop < 0) stop = 0;
    if (stop > dim) stop = dim;
    *start = s;
    return stop > s ? (stop - s + step - 1) / step : 0;
  }
  if (s < 0) s += dim;
  if (s < -1) s = -1;
  if (s > dim - 1) s = dim - 1;
  if (stop < 0) stop += dim;
  if (stop < -1) stop = -1;
  if (stop > dim - 1) stop = dim - 1;
  *start = s;
  return s > stop ? (s - stop - step - 1) / (-step) : 0;
}

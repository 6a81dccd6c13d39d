/*
 * dtrain.h: the public interface of libdtrain, one header to include.
 *
 *   status.h      errors: dt_status, dt_last_error()
 */
#ifndef DTRAIN_H
#define DTRAIN_H

#include "status.h"

#endif /* DTRAIN_H */

/* Checkpoint files built or damaged by hand (docs/CHECKPOINT.md), for the
 * tests (tests/helpers.c). A header of its own: test_cli.c uses it without
 * helpers.h, whose macros clash with its names. */
#ifndef DP_TEST_CKPT_BYTES_H
#define DP_TEST_CKPT_BYTES_H

#include <stddef.h>
#include <stdint.h>

/* A checkpoint's every checksum recomputed from its sections' own lengths (a
 * mutation made to reach the checks behind them); stops at a length that runs
 * past len. */
void ckpt_reseal(unsigned char *b, size_t len);
/* A version 4 checkpoint written as version 1, 2 or 3 (no APPD before 3; STEP's
 * last word a reserved 0 before 4; version 1: STEP without the rate), as those
 * libraries wrote it (malloc'd, *out_len bytes). */
unsigned char *ckpt_as_version(const unsigned char *v4, size_t len, int version,
                               size_t *out_len);

#endif

/* tools/agree.h — rank agreement: before the first step of `dp train` under
 * mpirun, the ranks compare digests of everything that must be the same on
 * each of them, and a job whose ranks differ ends on every rank with one
 * message from rank 0 naming the first rank that differs and what differs
 * (docs/RELIABILITY.md, "Rank agreement").
 *
 * Tool-side code: nothing here prints or exits (cli.h's conventions). */
#ifndef DPT_AGREE_H
#define DPT_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "dp.h"

/* What must be the same on every rank of a dp train job. The paths may
 * differ (each rank reads its own files); their contents may not. */
typedef struct {
  const dp_model *model;
  const dpt_dataset *data; /* as read: before the split and the standardisation */
  const dp_config *cfg;
  const char *schedule; /* --lr-schedule as given; NULL: constant */
  int epochs, eval_every, patience;
  int standardize;        /* --standardize: 0 none, 1 feature, 2 channel */
  int resume;             /* --resume given (rank 0 reads the file and sends it) */
  /* --save and --save-best given (rank 0 writes the file, but the save is
   * collective: every rank takes part), and --save-every as given (NULL: none) */
  int save, save_best;
  const char *save_every;
  const dpt_dataset *val; /* --val-data as read (NULL: none) */
  uint64_t data_seed;     /* --data-seed (default: the seed) */
  int no_shuffle, header; /* --no-shuffle, --header */
  float test_fraction;
  int steps;           /* dp repro --steps, compared instead of --epochs (0: dp train) */
  const char *extra;   /* more "name=value" words, space-separated (dp repro's
                          configurations); NULL: none */
  int predict;         /* dp predict: the model is --checkpoint's, the rows are
                          not training data (the messages' words) */
  uint64_t model_more; /* hashed into the model's digest (dp predict: the
                          checkpoint's standardisation); 0: nothing */
} dpt_train_inputs;

#define DPT_AGREE_TEXT 1024
/* One rank's digests (FNV-1a 64, dp_hash_bytes): fixed-size, so the ranks
 * can gather them as plain bytes (the same build on every rank: the plan
 * hash at dp_ctx_create_mpi refuses another). */
typedef struct {
  uint64_t model;            /* of the spec text (dp_model_format) */
  uint64_t data;             /* of the rows as read: sizes, features, labels/targets */
  uint64_t settings;         /* of the whole settings text */
  int64_t rows;              /* rows as read, for the message */
  int predict;               /* dpt_train_inputs.predict, for the message */
  char text[DPT_AGREE_TEXT]; /* the settings: "name=value", "+flag", "-flag" words
                                (cut at a word when longer: the digest decides) */
} dpt_agree_rec;

/* Fills *r from in. 0, or -1 out of memory. */
int dpt_agree_record(const dpt_train_inputs *in, dpt_agree_rec *r);
/* Compares recs[1..n) with recs[0] (rank 0's): 0 when all agree, else the
 * first rank that differs, with "the ranks disagree: rank 1's training data
 * differs from rank 0's (...): give every rank the same --data file" in err. */
int dpt_agree_compare(const dpt_agree_rec *recs, int n, char *err, size_t errcap);
/* Collective under mpirun (every rank calls it at the same point): 0 when
 * every rank's inputs agree with rank 0's; -1 on every rank when one differs,
 * with the message in err on rank 0 and err empty elsewhere (one message for
 * the job; the failure is known to every rank, so each leaves by itself).
 * A rank out of memory for its record: -1 on every rank, "out of memory" in
 * err on that rank alone (known everywhere: each leaves by itself). One
 * process: 0. */
int dpt_agree_train(const dpt_train_inputs *in, char *err, size_t errcap);

#endif

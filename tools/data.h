/* tools/data.h — CSV datasets for `dp train`: load, split, scale, shuffle.
 *
 * Tool-side code: like the library it never prints and never exits. Functions
 * that can fail return dp_status and write a one-line message (no newline)
 * into err[0..errcap) when err is not NULL.
 *
 * File format (one sample per line, comma separated, no header):
 *   label,f1,f2,...,fN            classification (dpt_csv_load)
 *   t1,...,tK,f1,...,fN           regression (dpt_csv_load_regression)
 * - label: a non-negative decimal integer (optional '+'), at most
 *   DPT_MAX_LABEL. Class count = largest label + 1.
 * - features and targets: decimal floats: integers, decimals, exponents, a
 *   leading sign ("3", "-0.5", "+1e-3", ".5"). nan/inf are refused, and so
 *   are values outside float's range and hexadecimal forms.
 * - spaces and tabs around a field are ignored; an empty field is an error.
 * - lines whose first non-blank character is '#' are comments; blank lines
 *   are skipped; LF or CRLF line ends.
 * - every data row has the same number of fields; at least one feature.
 * Errors read "path:line: field k: what" (line and field 1-based, the label
 * is field 1), or "path:line: what" for whole-row problems, e.g.
 *   data/x.csv:17: field 3: expected a number, got "abc"
 *   data/x.csv:17: field count 64, expected 65
 * The file must be a regular file: a directory, FIFO, socket or device is
 * refused (DP_ERR_IO, "cannot read data 'x': is a directory"), checked
 * without blocking (a FIFO with no writer never makes the loader wait).
 * Status: DP_ERR_IO (open/read), DP_ERR_PARSE (syntax, field count, empty
 * file), DP_ERR_RANGE (negative or too-large label, float overflow),
 * DP_ERR_NONFINITE (nan/inf), DP_ERR_NOMEM, DP_ERR_OVERFLOW (sizes).
 */
#ifndef DPT_DATA_H
#define DPT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dp.h"

struct dpt_scaler; /* below */

#define DPT_MAX_LABEL 65535 /* larger labels are refused (DP_ERR_RANGE) */
/* Longest line (bytes, newline included) the loader reads; a longer one is
 * refused (DP_ERR_PARSE) before more memory is taken. */
#define DPT_MAX_LINE (64 << 20)

/* Element types of features read as they are (xmap): a binary file's, a
 * text's bytes, --tokens' int32 ids. */
enum { DPT_X_F32 = 1, DPT_X_F64, DPT_X_U8, DPT_X_I32 };

typedef struct {
  int n_rows, n_features;
  float *x;        /* (n_rows, n_features) row-major; NULL: the rows are in xmap */
  int32_t *label;  /* (n_rows, label_width) class index; NULL for regression */
  float *y;        /* (n_rows, n_targets) regression targets; NULL for
                      classification */
  int n_targets;   /* 0 for classification */
  int n_classes;   /* largest label + 1; 0 for regression */
  int label_width; /* labels per row: 0 or 1, one; T for token windows */
  /* Features of a binary file read in place (x NULL): file row r's n_features
   * values at xmap + r * n_features * (4, 8, 1 or 4) bytes, of type xtype
   * (DPT_X_*), checked when loaded (finite, within float's range). The file
   * is mapped (mmap), never copied, so a file larger than memory works; a
   * gzip'd one is decompressed into memory. own/own_len/own_mapped: what
   * backs xmap, freed with the dataset. */
  const unsigned char *xmap;
  int xtype;
  void *own;
  size_t own_len;
  int own_mapped;
  /* A view (dpt_dataset_split of a dataset in xmap): row i is row rows[i] of
   * xmap, which belongs to another dataset (borrowed: not freed here); its
   * labels and targets are its own copies, but for a sequence's head or tail
   * (a contiguous range in file order), which borrows its labels too, and its
   * x when in memory. A borrowing dataset needs its source alive and
   * unchanged (dpt_standardize leaves a borrowed x alone). */
  int *rows;
  int borrowed;        /* x or xmap is another dataset's (not freed here) */
  int labels_borrowed; /* labels not freed here: a sequence's head or tail
                          (src's), --tokens' windows (in own) */
  int header_line; /* CSV: the line of the header row that was skipped (0: none) */
} dpt_dataset;

/* Loads a classification CSV. On failure *out is left empty (all zero). */
dp_status dpt_csv_load(const char *path, dpt_dataset *out, char *err, size_t errcap);
/* Loads a regression CSV whose first n_targets (>= 1) fields are targets. */
dp_status dpt_csv_load_regression(const char *path, int n_targets, dpt_dataset *out,
                                  char *err, size_t errcap);
/* Loads rows of features only (no label, no targets): what dp predict reads
 * for a service's inputs. */
dp_status dpt_csv_load_features(const char *path, dpt_dataset *out, char *err,
                                size_t errcap);
/* Frees the arrays and zeroes *d. NULL and already-freed datasets are fine. */
void dpt_dataset_free(dpt_dataset *d);
/* The first row (0-based, file order) whose class label is `classes` or more:
 * one the model has no output for; -1 when none (or no labels). */
int dpt_first_label_past(const dpt_dataset *d, int classes);

/* The message for data whose rows have another feature count than the model's
 * input (in_w), to err: with the targets in the same rows (a CSV without
 * --labels: a label first, or loss mse's targets), how the fields split, for
 * the count of fields is what the user sees in the file. */
void dpt_width_mismatch(char *err, size_t errcap, const char *path, const char *model,
                        const dpt_dataset *d, int in_w, int targets_in_rows);

/* Every reader behind --data/--labels (dp train, dp predict): the format is
 * told by the data file's first bytes, not its name:
 *   .npy      "\x93NUMPY": features of any shape, float32 ('<f4'), float64
 *             ('<f8') or uint8 ('|u1'), C order, little-endian; rows = the
 *             first dimension, features per row = the product of the others.
 *             Mapped, not parsed: the file may be larger than memory.
 *   IDX       MNIST's format (00 00 08 N, N big-endian dimensions): unsigned
 *             bytes, features as floats 0..255. Mapped too.
 *   gzip      (1f 8b) an IDX file gzip'd (train-images-idx3-ubyte.gz): read
 *             into memory through zlib (a build without zlib refuses it,
 *             saying how to gunzip it).
 *   CSV       anything else: dpt_csv_load's rows; a first row with a name (a
 *             field with a letter, ASCII or UTF-8, that is not a number) is a
 *             header, skipped (header 1: the first row is one in any case); a
 *             UTF-8 byte-order mark at the start is skipped.
 * Labels of binary data come from their own file (labels): .npy of int32,
 * int64 or uint8 class indices (shape (N,) or (N, 1)) or, for targets,
 * float32/float64 (shape (N,) or (N, n_targets)); or IDX (idx1-ubyte), gzip'd
 * or not; one per data row. A CSV holds its labels in its first field(s): a
 * labels file beside one is refused. Bad input is refused with its place:
 * "file:line: field k: ..." (CSV), "file: byte B: ..." or "file: byte B (row
 * r, value k): ..." (binary; rows and values counted from 0, as numpy does):
 * wrong magic, truncated, another dtype, Fortran order, big-endian, a shape
 * that does not hold the rows, a label out of range (below 0, or not below
 * n_outputs when that is > 0), NaN or infinite values, float64 values beyond
 * float's range, row counts that differ between the two files. *out is empty
 * on failure. */
typedef enum { DPT_ROWS_CLASSES, DPT_ROWS_TARGETS, DPT_ROWS_FEATURES } dpt_rows;
typedef struct {
  const char *data, *labels; /* labels: NULL for a CSV (its first fields) */
  const char *labels_opt;    /* the option that names labels, for messages */
  dpt_rows rows;             /* what a row holds besides its features */
  int n_targets;             /* DPT_ROWS_TARGETS: targets per row */
  int n_outputs;             /* DPT_ROWS_CLASSES: labels below it (0: any) */
  int header;                /* CSV: 1 the first row is a header (--header) */
  int labels_optional;       /* binary data without labels: features only */
  int n_features;            /* binary data: values a row (0: any) */
} dpt_data_spec;
dp_status dpt_data_load(const dpt_data_spec *spec, dpt_dataset *out, char *err,
                        size_t errcap);
/* dpt_csv_load* with header: 1 the first data row is a header, skipped; 0
 * detected (a field that is not a number: then at least one data row must
 * follow, else the row is read as data and its error reported, and every row
 * must have the header's field count). out->header_line says which line. */
dp_status dpt_csv_load_as(const char *path, dpt_rows rows, int n_targets, int header,
                          dpt_dataset *out, char *err, size_t errcap);

/* Rows of d into the batch: rows idx[from..from+n) (idx NULL: from..from+n),
 * each n_features floats into x, standardised by sc (NULL or n 0: as they
 * are), and their labels (label_width each) or targets into t (NULL: not
 * wanted). Reads only the rows asked for: no allocation, whatever d's size. */
void dpt_dataset_gather(const dpt_dataset *d, const struct dpt_scaler *sc, const int *idx,
                        int from, int n, float *x, void *t);

/* Deterministic shuffled split. n_test = ceil(test_fraction * n) (as
 * scikit-learn's train_test_split); 0 <= test_fraction < 1 and at least one
 * training row must remain, else DP_ERR_INVALID. The rows are shuffled by
 * `seed` (Fisher-Yates with a splitmix64 generator); test gets the first
 * n_test rows of that order and train the rest, each in shuffled order.
 * train and test are new datasets (free both) and keep all->n_classes; test
 * may have 0 rows (test_fraction 0). On failure both are left empty. */
dp_status dpt_dataset_split(const dpt_dataset *all, double test_fraction, uint64_t seed,
                            dpt_dataset *train, dpt_dataset *test, char *err,
                            size_t errcap);
/* The same, or with shuffle 0 the rows in file order: train the first n -
 * n_test, test the last n_test (the held-out tail). A dataset whose features
 * are in xmap splits into views of it (rows arrays; nothing copied but the
 * labels), so the features are never in memory twice; a sequence's windows
 * (label_width > 1) split in file order borrow their labels, and their x when
 * in memory: all must then outlive train and test. */
dp_status dpt_dataset_split_as(const dpt_dataset *all, double test_fraction, int shuffle,
                               uint64_t seed, dpt_dataset *train, dpt_dataset *test,
                               char *err, size_t errcap);

/* Per-feature standardisation: mean and population standard deviation of
 * each feature over train (in double), then x = (x - mean) / std on train and
 * on test (test may be NULL). Constant features get std 1 (as scikit-learn's
 * StandardScaler), so they become 0. Targets are not touched; nor is a
 * borrowed x (another dataset's rows). */
void dpt_standardize(dpt_dataset *train, dpt_dataset *test);

/* The standardisation itself, to keep and apply again (dp train saves it in
 * its checkpoints; dp predict applies it): per feature, mean and population
 * standard deviation over train, as dpt_standardize computes them; or, with
 * per_channel, per input channel of an image model (channels C of C*H*W
 * features each row: the statistics over the H*W values of each channel of
 * every training row, as torchvision's Normalize takes them). A feature or
 * channel whose deviation is 0 (or tiny against its mean) gets std 1 (it
 * becomes 0); the fit counts them in n_constant and keeps the first indices,
 * for the warning dp train prints. dpt_scaler_fit (per feature) and
 * dpt_scaler_fit_channels (channels C >= 1 dividing the feature count) return
 * 0, or -1 out of memory (*sc empty); an empty training set gives n = 0.
 * dpt_scaler_apply does x = (x - mean) / std on d in double, saturated to
 * float's range (nothing when the sizes do not fit). */
#define DPT_CONSTANT_SHOWN 8
typedef struct dpt_scaler {
  int n;
  double *mean, *std;               /* (n) */
  int per_channel;                  /* 1: n channels, 0: n features */
  int n_constant;                   /* the fit's features or channels of deviation 0 */
  int constant[DPT_CONSTANT_SHOWN]; /* the first of them */
} dpt_scaler;
int dpt_scaler_fit(const dpt_dataset *train, dpt_scaler *sc);
int dpt_scaler_fit_channels(const dpt_dataset *train, int channels, dpt_scaler *sc);
void dpt_scaler_apply(const dpt_scaler *sc, dpt_dataset *d);
void dpt_scaler_free(dpt_scaler *sc);
/* "none", "feature" or "channel": the --standardize word of sc. */
const char *dpt_scaler_mode(const dpt_scaler *sc);
/* Whether sc fits a model of `features` inputs and `channels` input channels
 * (0: not an image model): 0, or -1 with the reason in err. */
int dpt_scaler_fits(const dpt_scaler *sc, int features, int channels, char *err,
                    size_t errcap);
/* A summary for people: "per feature, 64 values; mean 0, 0.30, ...; std 1,
 * 0.91, ..." (the first few of each, 4 significant digits). */
void dpt_scaler_summary(const dpt_scaler *sc, char *buf, size_t cap);
/* The model's input channels, height and width (input C H W): 1, or 0 when
 * its input is not an image (then *c, *h, *w are 0). */
int dpt_model_image(const dp_model *m, int *c, int *h, int *w);

/* The standardisation in a safetensors file's metadata (dp export writes it,
 * dp import reads it back; docs/CHECKPOINT.md):
 *   "dp.standardize"  "none", "feature" or "channel"
 *   "dp.mean"         the means, comma-separated, each the shortest decimal
 *   "dp.std"          that reads back as the same double (with "feature" and
 *                     "channel" only)
 * dpt_scaler_meta fills pairs[0..3) from sc with their text in *buf
 * (malloc'd: free it) and returns the pair count (1 for none, 3), or -1 out
 * of memory. dpt_scaler_from_meta finds them among a file's pairs: 1 found
 * (*sc filled; n 0 for "none"), 0 absent, -1 malformed (err names the key and
 * what is wrong: another word, a field that is not a finite number, a
 * deviation not above 0, counts that differ, a key without the others). */
int dpt_scaler_meta(const dpt_scaler *sc, dp_meta pairs[3], char **buf);
int dpt_scaler_from_meta(const dp_meta *pairs, int n, dpt_scaler *sc, char *err,
                         size_t errcap);
/* The standardisation in a checkpoint's dp train record: 0 with *sc filled
 * (n 0: none) and *has_record 1, or *has_record 0 when the checkpoint has no
 * dp train record (dp import of a file without one, dp_ckpt_save); -1 with
 * the reason in err (unreadable, or a record that is not dp train's). */
int dpt_ckpt_scaler(const char *path, dpt_scaler *sc, int *has_record, char *err,
                    size_t errcap);

/* The run dp train keeps in its checkpoints' application data
 * (dp_ckpt_save_app), so that a resume continues it and dp predict
 * standardises as it did: epochs done, training rows, the standardisation (n
 * = 0: none), and the run's settings (one line of "name=value" words, dp
 * train's; *settings malloc'd, NULL when the record has none; settings may
 * be NULL). dpt_run_text returns malloc'd text (NULL: out of memory), its
 * length in *len; dpt_run_parse returns 0, or -1 with a message (not dp
 * train's record, or damaged), filling *sc (free it). It checks every number:
 * epochs 0 to DPT_MAX_EPOCHS, rows 0 to INT_MAX, standardize 0, 1 (per
 * feature) or 2 (per channel), features 0 (standardize 0) or 1 to 2^24 (the
 * features, or the channels), means finite, deviations finite and > 0. */
#define DPT_MAX_EPOCHS 1000000000 /* a record's epochs, and a resume's total */
char *dpt_run_text(int epochs, int rows, const dpt_scaler *sc, const char *settings,
                   size_t *len);
int dpt_run_parse(const char *text, size_t len, int *epochs, int *rows, dpt_scaler *sc,
                  char **settings, char *err, size_t errcap);
/* A run saved inside an epoch (dp train stopped by a signal, or --save-every
 * N steps): the record of dpt_run_text with a last line "position N", the
 * training calls done (0 < N <= INT_MAX) in the epoch after its `epochs`.
 * dpt_run_parse accepts the line; dpt_run_position gives N from a record it
 * accepted (0: none, the run was saved at the end of an epoch). */
char *dpt_run_text_at(int epochs, int position, int rows, const dpt_scaler *sc,
                      const char *settings, size_t *len);
int dpt_run_position(const char *text, size_t len);

/* Shuffled epoch order: perm[0..n) becomes a permutation of 0..n-1 that
 * depends only on (seed, epoch). Does nothing when n <= 0 or perm is NULL. */
void dpt_epoch_order(int n, uint64_t seed, int epoch, int *perm);

/* A .npy file's header (format versions 1 to 3), b[0..n) its bytes: dtype
 * (descr as written, e.g. "<f4"; its kind 'f', 'i', 'u', ... and size in
 * bytes), order, shape, and where the data starts; the byte offsets of the
 * fields, for messages. Refused: no magic, another version, a header longer
 * than the file, a descr that is not a simple dtype, a shape that is not a
 * tuple of at most 8 sizes. The one parser of .npy headers (the token loader
 * and the dataset readers check what they take from it). */
typedef struct {
  char descr[16];
  char kind;
  int size, big_endian, fortran, ndim;
  uint64_t shape[8], numel;
  size_t data;                           /* the first element's byte offset */
  size_t at_descr, at_fortran, at_shape; /* where those fields are */
} dpt_npy;
dp_status dpt_npy_parse(const char *path, const unsigned char *b, size_t n, dpt_npy *h,
                        char *err, size_t errcap);

/* Token streams for sequence models (dp train --text / --tokens): ids, n of
 * them. dpt_text_load: every byte of a regular file is an id (0..255).
 * dpt_npy_load_tokens: a 1-D .npy array of little-endian int32 ('<i4') or
 * uint16 ('<u2') in C order; another dtype, order, shape or version is refused
 * naming it, and so is an id >= vocab (naming its index). DP_ERR_IO,
 * DP_ERR_PARSE, DP_ERR_RANGE, DP_ERR_NOMEM; *out empty on failure. */
typedef struct {
  int32_t *id;         /* dpt_npy_load_tokens's ids, or NULL */
  unsigned char *byte; /* dpt_text_load's bytes (each an id), or NULL */
  size_t n;
} dpt_tokens;
/* Id i of t (i < t->n). */
static inline int32_t dpt_token(const dpt_tokens *t, size_t i) {
  return t->byte ? (int32_t)t->byte[i] : t->id[i];
}
dp_status dpt_text_load(const char *path, dpt_tokens *out, char *err, size_t errcap);
dp_status dpt_npy_load_tokens(const char *path, int vocab, dpt_tokens *out, char *err,
                              size_t errcap);
void dpt_tokens_free(dpt_tokens *t);
/* Windows of T + 1 consecutive ids of tok's [from..to), one starting every T
 * ids: row r's inputs are ids from + rT .. + T - 1 (as floats), its labels
 * (label_width T) the next T ids. (to - from - 1) / T rows; 0 rows is fine.
 * The ids move into the dataset, which reads its inputs from them in place
 * (xmap: a text's bytes, u8, taking 5 bytes of memory per byte, not 20;
 * --tokens' ids, i32, whose labels it reads in place too: 4 bytes per id, not
 * 12); tok then holds its count alone. */
dp_status dpt_token_windows(dpt_tokens *tok, size_t from, size_t to, int T,
                            dpt_dataset *out, char *err, size_t errcap);

#endif

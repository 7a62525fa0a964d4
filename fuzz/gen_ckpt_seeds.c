/* Writes real checkpoints of the fuzz_checkpoint fixtures into DIR, as seeds:
 *   gen_ckpt_seeds DIR
 * ctxI_stepS.ckpt for each fixture I (see ckpt_fixture.h) after S = 0 and 3
 * training steps, and other_model.ckpt (a different model, which every
 * fixture must refuse). `ninja fuzz` runs it before fuzzing, so the seeds
 * always match the library's current format; fuzz/corpus/fuzz_checkpoint/
 * holds a committed copy. */
#include "ckpt_fixture.h"

#include <stdio.h>

static int save(fixture *f, const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  dp_status s = dp_ckpt_save(f->ctx, path);
  if (s) fprintf(stderr, "gen_ckpt_seeds: %s: %s\n", path, dp_ctx_error(f->ctx));
  return s != DP_OK;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_ckpt_seeds DIR\n");
    return 2;
  }
  int bad = 0;
  for (int i = 0; i < FIXTURE_N; i++) {
    fixture f;
    if (fixture_make(i, FIXTURE_MODEL, &f)) {
      fprintf(stderr, "gen_ckpt_seeds: fixture %d: %s\n", i, dp_last_error());
      fixture_free(&f);
      return 1;
    }
    char name[64];
    snprintf(name, sizeof name, "ctx%d_step0.ckpt", i);
    bad |= save(&f, argv[1], name);
    if (!dp_plan_config(f.plan)->inference) {
      bad |= fixture_train(&f, 3) != DP_OK;
      snprintf(name, sizeof name, "ctx%d_step3.ckpt", i);
      bad |= save(&f, argv[1], name);
    }
    fixture_free(&f);
  }
  fixture other;
  if (fixture_make(1, FIXTURE_OTHER_MODEL, &other) || fixture_train(&other, 1)) {
    fprintf(stderr, "gen_ckpt_seeds: other model: %s\n", dp_last_error());
    bad = 1;
  } else {
    bad |= save(&other, argv[1], "other_model.ckpt");
  }
  fixture_free(&other);
  return bad;
}

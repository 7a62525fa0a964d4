/* tools/svg.h — small SVG charts for the dp tool (plain files, no dependencies).
 *
 * Like the library, these never print and never exit: they return dp_status
 * and write a one-line message into err[0..errcap) (when err is not NULL).
 * DP_ERR_INVALID for bad arguments, DP_ERR_IO when the file cannot be
 * written ("cannot write chart 'x.svg': ..."; a full disk is reported). The
 * chart is written as checkpoints are (dp_file_create: a temporary file
 * renamed over path), so a write that fails leaves the old file as it was,
 * and a directory, FIFO or device at path is refused, untouched.
 * Text arguments (title, labels, names) are XML-escaped; NULL means none.
 */
#ifndef DPT_SVG_H
#define DPT_SVG_H

#include <stddef.h>

#include "dp.h"

/* Line chart of y[0..n), e.g. a loss curve: point i is drawn at x = i + 1.
 * Axes with "nice" ticks and labels, a title, axis labels, one polyline
 * (split where y is NaN/Inf; those points are skipped). n >= 1; n = 1 and
 * constant values get a padded range and a visible point marker. */
dp_status dpt_svg_line_plot(const char *path, const char *title, const char *xlabel,
                            const char *ylabel, const float *y, int n, char *err,
                            size_t errcap);

/* One curve of dpt_svg_lines: y[0..n) at x[0..n) (x NULL: x = i + 1); name
 * (NULL: none) is its legend entry; color a CSS colour (NULL: the palette by
 * the curve's index, the first one "#1f77b4"). */
typedef struct {
  const char *name;
  const double *x;
  const float *y;
  int n;
  const char *color;
} dpt_svg_series;

/* Line chart of several curves on shared axes (the x range covers every
 * curve's points), each drawn as dpt_svg_line_plot draws its one: a polyline
 * per run of finite values, point markers for a curve of <= 40 points. With
 * more than one curve, a legend (a short line of each colour and the name) in
 * the top right corner. A title with a '\n' has a second line, smaller, under
 * the first (e.g. the run's settings). log_y: a logarithmic y axis from the
 * power of ten at or below the smallest positive value to the one at or above
 * the largest, ticks and labels at the powers of ten ("0.01", "0.1", "1";
 * "1e-05" beyond 4 decades from 1) and unlabelled grid lines at 2..9 times
 * them where a decade is tall enough; values <= 0 are skipped there like NaN.
 * Every curve needs n >= 1 (n_series >= 1). */
dp_status dpt_svg_lines(const char *path, const char *title, const char *xlabel,
                        const char *ylabel, const dpt_svg_series *series, int n_series,
                        int log_y, char *err, size_t errcap);

/* Stacked bars, one per device: values is (n_bars, n_segments) byte counts
 * (finite, >= 0); segment s of bar b is values[b * n_segments + s], stacked
 * bottom-up in segment order. The y axis is in binary units (B, KiB, MiB,
 * GiB, TiB) picked from the tallest bar; the bar's total is written above
 * it. Zero-size segments are not drawn, and segments that are zero in every
 * bar are left out of the legend. bar_labels / segment_names may be NULL
 * ("dev 0", "segment 0", ...); segment_colors (CSS colours) may be NULL (a
 * palette by segment index): a caller that charts the same segments in several
 * pictures passes one colour per kind of segment, so that each keeps its colour
 * in every chart. With several bars, a segment that only the first bar has is
 * named on that bar and marked in the legend ("only <first bar's label>"). A bar
 * label may have a second line after a '\n' ("device 2\nrank 1"), written
 * smaller under the first; the legend names the first bar by its first line. */
dp_status dpt_svg_stacked_bars(const char *path, const char *title, int n_bars,
                               const char *const *bar_labels, int n_segments,
                               const char *const *segment_names,
                               const char *const *segment_colors, const double *values,
                               char *err, size_t errcap);

/* The same with a limit (bytes, > 0; 0: none), e.g. a memory budget: a dashed
 * line across the bars at that height, the y axis reaching it, and limit_label
 * (NULL: none) written at its right end. */
dp_status dpt_svg_stacked_bars_limit(const char *path, const char *title, int n_bars,
                                     const char *const *bar_labels, int n_segments,
                                     const char *const *segment_names,
                                     const char *const *segment_colors,
                                     const double *values, double limit,
                                     const char *limit_label, char *err, size_t errcap);

/* Human-readable bytes: "512 B", "1.50 KiB", "12.5 MiB", "640 GiB". Writes a
 * NUL-terminated string into buf and returns buf. */
char *dpt_format_bytes(double bytes, char *buf, size_t cap);

#endif

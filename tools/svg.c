/* tools/svg.c — small SVG charts. See svg.h. */
#include "svg.h"

#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static dp_status fail(dp_status s, char *err, size_t errcap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static dp_status fail(dp_status s, char *err, size_t errcap, const char *fmt, ...) {
  if (err && errcap > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errcap, fmt, ap);
    va_end(ap);
  }
  return s;
}

static const char *const FONT = "font-family=\"sans-serif\"";
static const char *const PALETTE[] = {
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#8c564b",
};
#define N_PALETTE (int)(sizeof PALETTE / sizeof PALETTE[0])

/* Writes s[0..len) (up to a NUL) with &, <, >, ", ' escaped. */
static void put_textn(FILE *f, const char *s, size_t len) {
  for (size_t i = 0; s && i < len && s[i]; i++) {
    switch (s[i]) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&apos;", f); break;
    default: fputc(s[i], f);
    }
  }
}

/* Writes s with &, <, >, ", ' escaped. */
static void put_text(FILE *f, const char *s) { put_textn(f, s, s ? strlen(s) : 0); }

/* <text x y anchor [rotate]>escaped s[0..len)</text> */
static void text_atn(FILE *f, double x, double y, const char *anchor, int size,
                     const char *rotate, const char *s, size_t len) {
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%d\" %s", x, y,
          anchor, size, FONT);
  if (rotate) fprintf(f, " transform=\"rotate(%s %.1f %.1f)\"", rotate, x, y);
  fputs(">", f);
  put_textn(f, s, len);
  fputs("</text>\n", f);
}

/* <text x y anchor [rotate]>escaped</text> */
static void text_at(FILE *f, double x, double y, const char *anchor, int size,
                    const char *rotate, const char *s) {
  text_atn(f, x, y, anchor, size, rotate, s, s ? strlen(s) : 0);
}

/* 1, 2 or 5 times a power of ten, >= raw (raw > 0). */
static double nice_step(double raw) {
  double p = pow(10.0, floor(log10(raw)));
  double m = raw / p;
  double k = m <= 1.0 ? 1.0 : m <= 2.0 ? 2.0 : m <= 5.0 ? 5.0 : 10.0;
  return k * p;
}

/* Decimal places that show multiples of step exactly (0..9). */
static int step_decimals(double step) {
  if (step >= 1.0) return 0;
  int d = (int)ceil(-log10(step) - 1e-9);
  return d > 9 ? 9 : d;
}

static void format_tick(char *buf, size_t cap, double v, double step, double maxabs) {
  if (fabs(v) < step * 1e-6) v = 0.0; /* no "-0.00" */
  if (maxabs >= 1e6 || step < 1e-6)
    snprintf(buf, cap, "%.3g", v);
  else
    snprintf(buf, cap, "%.*f", step_decimals(step), v);
}

/* The chart is written whole to a temporary file and renamed over path
 * (dp_file_create): a failed write leaves the old file as it was. */
static dp_status finish(dp_file *out, char *err, size_t errcap) {
  if (dp_file_commit(out) == DP_OK) return DP_OK;
  return fail(DP_ERR_IO, err, errcap, "%s", dpt_user_msg(dp_last_error()));
}

static dp_file *open_out(const char *path, char *err, size_t errcap, dp_status *s) {
  dp_file *f = NULL;
  if ((*s = dp_file_create(path, "chart", &f)))
    fail(*s, err, errcap, "%s", dpt_user_msg(dp_last_error()));
  return f;
}

/* ---- line plot ------------------------------------------------------------- */

/* The curves' colours by index (the first is the single curve's of old). */
static const char *const LINE_COLORS[] = {"#1f77b4", "#ff7f0e", "#2ca02c",
                                          "#d62728", "#9467bd", "#8c564b"};
#define N_LINE_COLORS (int)(sizeof LINE_COLORS / sizeof LINE_COLORS[0])

/* A value that can be drawn: finite, and above 0 on a log axis. */
static int drawable(double v, int log_y) { return isfinite(v) && (!log_y || v > 0.0); }

dp_status dpt_svg_line_plot(const char *path, const char *title, const char *xlabel,
                            const char *ylabel, const float *y, int n, char *err,
                            size_t errcap) {
  if (!path || !y || n < 1)
    return fail(DP_ERR_INVALID, err, errcap,
                "dpt_svg_line_plot: need a path and at least one value (n = %d)", n);
  dpt_svg_series one = {.y = y, .n = n};
  return dpt_svg_lines(path, title, xlabel, ylabel, &one, 1, 0, err, errcap);
}

dp_status dpt_svg_lines(const char *path, const char *title, const char *xlabel,
                        const char *ylabel, const dpt_svg_series *series, int n_series,
                        int log_y, char *err, size_t errcap) {
  if (!path || !series || n_series < 1)
    return fail(DP_ERR_INVALID, err, errcap,
                "dpt_svg_lines: need a path and at least one curve (%d)", n_series);
  for (int c = 0; c < n_series; c++)
    if (!series[c].y || series[c].n < 1)
      return fail(DP_ERR_INVALID, err, errcap,
                  "dpt_svg_lines: curve %d needs at least one value (n = %d)", c,
                  series[c].n);

  /* a second title line (after a '\n'), smaller, under the first */
  const char *sub = title ? strchr(title, '\n') : NULL;
  size_t head = title ? (sub ? (size_t)(sub - title) : strlen(title)) : 0;
  if (sub) sub++;
  const double W = 640, H = 400, L = 80, R = 24, T = sub ? 60 : 44, B = 56;
  const double pw = W - L - R, ph = H - T - B;

#define XOF(c, i) (series[c].x ? series[c].x[i] : (double)(i) + 1.0)
  /* y range over the values that can be drawn, widened to nice tick bounds
   * (log: to powers of ten, y0 and y1 being their exponents) */
  double lo = INFINITY, hi = -INFINITY, x0 = INFINITY, x1 = -INFINITY;
  for (int c = 0; c < n_series; c++)
    for (int i = 0; i < series[c].n; i++) {
      double v = series[c].y[i], xv = XOF(c, i);
      if (isfinite(xv)) {
        if (xv < x0) x0 = xv;
        if (xv > x1) x1 = xv;
      }
      if (!drawable(v, log_y)) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  double ystep, y0, y1;
  if (log_y) {
    if (lo > hi) lo = 0.1, hi = 1.0; /* nothing to draw: an empty frame */
    y0 = floor(log10(lo) + 1e-9);
    y1 = ceil(log10(hi) - 1e-9);
    if (y1 <= y0) y1 = y0 + 1.0;
    ystep = ceil((y1 - y0) / 10.0); /* at most about 10 labelled decades */
  } else {
    if (lo > hi) lo = 0.0, hi = 1.0;  /* nothing finite: an empty frame */
    if (hi - lo <= fabs(hi) * 1e-9) { /* constant */
      double pad = fabs(lo) > 0.0 ? fabs(lo) * 0.1 : 1.0;
      lo -= pad;
      hi += pad;
    }
    ystep = nice_step((hi - lo) / 5.0);
    y0 = floor(lo / ystep + 1e-9) * ystep;
    y1 = ceil(hi / ystep - 1e-9) * ystep;
    if (y1 <= y0) y1 = y0 + ystep;
  }
  double ymaxabs = fmax(fabs(y0), fabs(y1));

  /* x: the points' range (one point: padded by 1 each side) */
  if (!(x0 <= x1)) x0 = x1 = 1.0;
  if (x1 - x0 < 1e-9) x0 -= 1.0, x1 += 1.0;
  double xstep = nice_step((x1 - x0) / 6.0);
  if (xstep < 1.0) xstep = 1.0;

#define PX(v) (L + ((v)-x0) / (x1 - x0) * pw)
#define PYL(e) (T + ph - ((e)-y0) / (y1 - y0) * ph) /* e: the value or its exponent */
#define PY(v) PYL(log_y ? log10(v) : (v))

  dp_status s = DP_OK;
  dp_file *out = open_out(path, err, errcap, &s);
  if (!out) return s;
  FILE *f = dp_file_stream(out);
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\">\n",
          W, H, W, H);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  if (title) text_atn(f, W / 2, 26, "middle", 16, NULL, title, head);
  if (sub) text_at(f, W / 2, 44, "middle", 11, NULL, sub);

  /* grid and ticks */
  char buf[64];
  int ny = (int)floor((y1 - y0) / ystep + 0.5);
  fputs("<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n", f);
  for (int k = 0; k <= ny; k++) {
    double v = y0 + k * ystep;
    fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", L, PYL(v),
            L + pw, PYL(v));
  }
  fputs("</g>\n", f);
  if (log_y && ph / (y1 - y0) >= 40) { /* 2..9 times each power of ten */
    fputs("<g stroke=\"#f0f0f0\" stroke-width=\"1\">\n", f);
    for (double e = y0; e < y1; e += 1.0)
      for (int m = 2; m <= 9; m++) {
        double yy = PYL(e + log10((double)m));
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", L, yy,
                L + pw, yy);
      }
    fputs("</g>\n", f);
  }
  for (int k = 0; k <= ny; k++) {
    double v = y0 + k * ystep;
    fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n",
            L - 5, PYL(v), L, PYL(v));
    if (log_y)
      snprintf(buf, sizeof buf, "%g", pow(10.0, v));
    else
      format_tick(buf, sizeof buf, v, ystep, ymaxabs);
    text_at(f, L - 8, PYL(v) + 4, "end", 11, NULL, buf);
  }
  double xt0 = ceil(x0 / xstep - 1e-9) * xstep;
  for (int k = 0; xt0 + k * xstep <= x1 + 1e-9; k++) {
    double v = xt0 + k * xstep;
    fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n",
            PX(v), T + ph, PX(v), T + ph + 5);
    snprintf(buf, sizeof buf, "%.0f", v);
    text_at(f, PX(v), T + ph + 18, "middle", 11, NULL, buf);
  }
  /* axes */
  fprintf(f,
          "<path d=\"M%.2f %.2f V%.2f H%.2f\" fill=\"none\" stroke=\"black\" "
          "stroke-width=\"1.2\"/>\n",
          L, T, T + ph, L + pw);
  if (xlabel) text_at(f, L + pw / 2, H - 14, "middle", 13, NULL, xlabel);
  if (ylabel) text_at(f, 18, T + ph / 2, "middle", 13, "-90", ylabel);

  /* each curve: one polyline per run of values that can be drawn */
  for (int c = 0; c < n_series; c++) {
    const float *y = series[c].y;
    int n = series[c].n;
    const char *color = series[c].color ? series[c].color : LINE_COLORS[c % N_LINE_COLORS];
    int open = 0;
    for (int i = 0; i < n; i++) {
      if (!drawable(y[i], log_y) || !isfinite(XOF(c, i))) {
        if (open) fputs("\"/>\n", f);
        open = 0;
        continue;
      }
      if (!open)
        fprintf(f,
                "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" "
                "stroke-linejoin=\"round\" points=\"",
                color);
      fprintf(f, "%s%.2f,%.2f", open ? " " : "", PX(XOF(c, i)), PY((double)y[i]));
      open = 1;
    }
    if (open) fputs("\"/>\n", f);
    if (n <= 40)
      for (int i = 0; i < n; i++)
        if (drawable(y[i], log_y) && isfinite(XOF(c, i)))
          fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\"/>\n",
                  PX(XOF(c, i)), PY((double)y[i]), color);
  }

  /* the legend, top right inside the frame (about 7 px a character at 12 px) */
  if (n_series > 1) {
    size_t longest = 4;
    for (int c = 0; c < n_series; c++) {
      size_t len = series[c].name ? strlen(series[c].name) : 8;
      if (len > longest) longest = len;
    }
    double lw = 44 + 7.0 * (double)longest, lh = 8 + 18.0 * n_series;
    double lx = L + pw - lw - 8, ly = T + 8;
    fprintf(f,
            "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"white\" "
            "fill-opacity=\"0.85\" stroke=\"#c0c0c0\"/>\n",
            lx, ly, lw, lh);
    for (int c = 0; c < n_series; c++) {
      const char *color =
          series[c].color ? series[c].color : LINE_COLORS[c % N_LINE_COLORS];
      double yy = ly + 13 + 18.0 * c;
      fprintf(f,
              "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
              "stroke-width=\"1.8\"/>\n",
              lx + 8, yy, lx + 32, yy, color);
      if (series[c].name) {
        text_at(f, lx + 38, yy + 4, "start", 12, NULL, series[c].name);
      } else {
        snprintf(buf, sizeof buf, "curve %d", c + 1);
        text_at(f, lx + 38, yy + 4, "start", 12, NULL, buf);
      }
    }
  }
#undef PX
#undef PY
#undef PYL
#undef XOF
  fputs("</svg>\n", f);
  return finish(out, err, errcap);
}

/* ---- stacked bars ------------------------------------------------------------ */

char *dpt_format_bytes(double bytes, char *buf, size_t cap) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && fabs(bytes) >= 1024.0) {
    bytes /= 1024.0;
    u++;
  }
  if (!buf || cap == 0) return buf;
  if (u == 0)
    snprintf(buf, cap, "%.0f B", bytes);
  else
    snprintf(buf, cap, "%.*f %s",
             fabs(bytes) < 10    ? 2
             : fabs(bytes) < 100 ? 1
                                 : 0,
             bytes, units[u]);
  return buf;
}

/* 1 when segment s is non-zero in bar 0 and zero in every other bar (n_bars > 1). */
static int only_first(const double *values, int n_bars, int n_segments, int s) {
  if (n_bars < 2 || !(values[s] > 0.0)) return 0;
  for (int b = 1; b < n_bars; b++)
    if (values[(size_t)b * (size_t)n_segments + (size_t)s] > 0.0) return 0;
  return 1;
}

dp_status dpt_svg_stacked_bars(const char *path, const char *title, int n_bars,
                               const char *const *bar_labels, int n_segments,
                               const char *const *segment_names,
                               const char *const *segment_colors, const double *values,
                               char *err, size_t errcap) {
#define COLOR(s)                                                                           \
  (segment_colors && segment_colors[s] ? segment_colors[s] : PALETTE[(s) % N_PALETTE])
  if (!path || !values || n_bars < 1 || n_segments < 1)
    return fail(DP_ERR_INVALID, err, errcap,
                "dpt_svg_stacked_bars: need a path, values and at least one bar and "
                "segment (bars %d, segments %d)",
                n_bars, n_segments);
  double top = 0.0;
  for (int b = 0; b < n_bars; b++) {
    double t = 0.0;
    for (int s = 0; s < n_segments; s++) {
      double v = values[(size_t)b * (size_t)n_segments + (size_t)s];
      if (!(v >= 0.0) || !isfinite(v))
        return fail(DP_ERR_INVALID, err, errcap,
                    "dpt_svg_stacked_bars: bar %d segment %d: value %g is not a "
                    "finite byte count >= 0",
                    b, s, v);
      t += v;
    }
    if (t > top) top = t;
  }

  /* unit from the tallest bar, nice ticks in that unit */
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double scale = 1.0;
  while (u < 4 && top >= scale * 1024.0) {
    scale *= 1024.0;
    u++;
  }
  double top_u = top / scale;
  if (top_u <= 0.0) top_u = 1.0;
  double step = nice_step(top_u / 5.0);
  if (u == 0 && step < 1.0) step = 1.0; /* no fractional bytes */
  double y1 = ceil(top_u / step - 1e-9) * step;

  /* the legend as wide as its longest entry (about 7 px a character at 12 px) */
  size_t longest = 12;
  for (int s = 0; s < n_segments; s++) {
    size_t len = segment_names && segment_names[s] ? strlen(segment_names[s]) : 10;
    if (only_first(values, n_bars, n_segments, s))
      len += 8 + (bar_labels && bar_labels[0] ? strcspn(bar_labels[0], "\n") : 5);
    if (len > longest) longest = len;
  }
  const double L = 90, R = 20, T = 44, B = 60, LEGEND = 40 + 7.0 * (double)longest;
  double slot = n_bars <= 4 ? 110 : 80;
  const double pw = slot * n_bars, ph = 300;
  double W = L + pw + R + LEGEND;
  if (title && W < 9.0 * (double)strlen(title) + 40) W = 9.0 * (double)strlen(title) + 40;
  double H = T + ph + B;
  int n_legend = 0;
  for (int s = 0; s < n_segments; s++)
    for (int b = 0; b < n_bars; b++)
      if (values[(size_t)b * (size_t)n_segments + (size_t)s] > 0.0) {
        n_legend++;
        break;
      }
  if (T + 20 + 18.0 * n_legend > H) H = T + 20 + 18.0 * n_legend;

#define PY(v) (T + ph - (v) / y1 * ph) /* v in units */

  dp_status st = DP_OK;
  dp_file *out = open_out(path, err, errcap, &st);
  if (!out) return st;
  FILE *f = dp_file_stream(out);
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\">\n",
          W, H, W, H);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  if (title) text_at(f, W / 2, 26, "middle", 16, NULL, title);

  char buf[64], lab[64];
  int nt = (int)floor(y1 / step + 0.5);
  for (int k = 0; k <= nt; k++) {
    double v = k * step;
    fprintf(f,
            "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#e0e0e0\"/>\n",
            L, PY(v), L + pw, PY(v));
    fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n",
            L - 5, PY(v), L, PY(v));
    snprintf(buf, sizeof buf, "%.*f %s", step_decimals(step), v, units[u]);
    text_at(f, L - 8, PY(v) + 4, "end", 11, NULL, buf);
  }
  fprintf(f,
          "<path d=\"M%.2f %.2f V%.2f H%.2f\" fill=\"none\" stroke=\"black\" "
          "stroke-width=\"1.2\"/>\n",
          L, T, T + ph, L + pw);

  for (int b = 0; b < n_bars; b++) {
    double bx = L + slot * b + slot * 0.2, bw = slot * 0.6;
    double acc = 0.0;
    for (int s = 0; s < n_segments; s++) {
      double v = values[(size_t)b * (size_t)n_segments + (size_t)s];
      if (v <= 0.0) continue;
      double ya = PY((acc + v) / scale), yb = PY(acc / scale);
      fprintf(f,
              "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" "
              "stroke=\"white\" stroke-width=\"0.5\"><title>",
              bx, ya, bw, yb - ya, COLOR(s));
      if (segment_names && segment_names[s])
        put_text(f, segment_names[s]);
      else
        fprintf(f, "segment %d", s);
      fprintf(f, ": %s (%.0f B)</title></rect>\n", dpt_format_bytes(v, buf, sizeof buf), v);
      /* what only the first bar holds, named on it where the segment is tall enough */
      if (b == 0 && yb - ya >= 11 && segment_names && segment_names[s] &&
          6.0 * (double)strlen(segment_names[s]) <= bw - 4 &&
          only_first(values, n_bars, n_segments, s)) {
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\" "
                "fill=\"white\" %s>",
                bx + bw / 2, (ya + yb) / 2 + 4, FONT);
        put_text(f, segment_names[s]);
        fputs("</text>\n", f);
      }
      acc += v;
    }
    text_at(f, bx + bw / 2, PY(acc / scale) - 6, "middle", 10, NULL,
            dpt_format_bytes(acc, buf, sizeof buf));
    if (bar_labels && bar_labels[b]) {
      /* a second line after a newline, smaller, under the first */
      const char *nl = strchr(bar_labels[b], '\n');
      snprintf(lab, sizeof lab, "%.*s",
               nl ? (int)(nl - bar_labels[b]) : (int)strlen(bar_labels[b]), bar_labels[b]);
      text_at(f, bx + bw / 2, T + ph + 18, "middle", 12, NULL, lab);
      if (nl) text_at(f, bx + bw / 2, T + ph + 33, "middle", 11, NULL, nl + 1);
    } else {
      snprintf(lab, sizeof lab, "dev %d", b);
      text_at(f, bx + bw / 2, T + ph + 18, "middle", 12, NULL, lab);
    }
  }

  /* legend: top to bottom in stacking order, bottom segment last (as drawn) */
  double lx = L + pw + R + 10, ly = T + 10;
  int row = 0;
  for (int s = n_segments - 1; s >= 0; s--) {
    int used = 0;
    for (int b = 0; b < n_bars; b++)
      if (values[(size_t)b * (size_t)n_segments + (size_t)s] > 0.0) used = 1;
    if (!used) continue;
    double yy = ly + 18.0 * row++;
    fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", lx,
            yy, COLOR(s));
    char name[96];
    if (segment_names && segment_names[s])
      snprintf(name, sizeof name, "%s", segment_names[s]);
    else
      snprintf(name, sizeof name, "segment %d", s);
    if (only_first(values, n_bars, n_segments, s)) {
      size_t len = strlen(name);
      int first = bar_labels && bar_labels[0] ? (int)strcspn(bar_labels[0], "\n") : 5;
      snprintf(name + len, sizeof name - len, " (only %.*s)", first,
               bar_labels && bar_labels[0] ? bar_labels[0] : "dev 0");
    }
    text_at(f, lx + 18, yy + 10, "start", 12, NULL, name);
  }
#undef PY
#undef COLOR
  fputs("</svg>\n", f);
  return finish(out, err, errcap);
}

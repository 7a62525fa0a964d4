/* tools/svg.c — small SVG charts. See svg.h. */
#include "svg.h"

#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
  return dpt_fail_status(DP_ERR_IO, err, errcap, "%s", dpt_user_msg(dp_last_error()));
}

/* The chart file at path, begun: the svg element of W x H and a white
 * background. NULL (with *s and err set) when it cannot be made. */
static dp_file *open_out(const char *path, double W, double H, char *err, size_t errcap,
                         dp_status *s) {
  dp_file *f = NULL;
  if ((*s = dp_file_create(path, "chart", &f))) {
    dpt_fail_status(*s, err, errcap, "%s", dpt_user_msg(dp_last_error()));
    return NULL;
  }
  FILE *o = dp_file_stream(f);
  fprintf(o,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\">\n",
          W, H, W, H);
  fprintf(o, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
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
    return dpt_fail_status(DP_ERR_INVALID, err, errcap,
                           "dpt_svg_line_plot: need a path and at least one value (n = %d)",
                           n);
  dpt_svg_series one = {.y = y, .n = n};
  return dpt_svg_lines(path, title, xlabel, ylabel, &one, 1, 0, err, errcap);
}

/* The frame of a line plot: its size, margins and axis ranges (log_y: y0 and
 * y1 are exponents of ten). */
typedef struct {
  double W, H, L, R, T, B, pw, ph;
  double x0, x1, xstep, y0, y1, ystep, ymaxabs;
  int log_y;
} line_frame;

static double xof(const dpt_svg_series *s, int i) {
  return s->x ? s->x[i] : (double)i + 1.0;
}
static double px(const line_frame *fr, double v) {
  return fr->L + (v - fr->x0) / (fr->x1 - fr->x0) * fr->pw;
}
/* e: the value or its exponent */
static double pyl(const line_frame *fr, double e) {
  return fr->T + fr->ph - (e - fr->y0) / (fr->y1 - fr->y0) * fr->ph;
}
static double py(const line_frame *fr, double v) {
  return pyl(fr, fr->log_y ? log10(v) : v);
}

/* The axis ranges: y over the values that can be drawn, widened to nice tick
 * bounds (log: to powers of ten); x over the points' range (one point: padded
 * by 1 each side). */
static void line_ranges(line_frame *fr, const dpt_svg_series *series, int n_series) {
  int log_y = fr->log_y;
  double lo = INFINITY, hi = -INFINITY, x0 = INFINITY, x1 = -INFINITY;
  for (int c = 0; c < n_series; c++)
    for (int i = 0; i < series[c].n; i++) {
      double v = series[c].y[i], xv = xof(&series[c], i);
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
  fr->ymaxabs = fmax(fabs(y0), fabs(y1));
  fr->y0 = y0;
  fr->y1 = y1;
  fr->ystep = ystep;

  if (!(x0 <= x1)) x0 = x1 = 1.0;
  if (x1 - x0 < 1e-9) x0 -= 1.0, x1 += 1.0;
  double xstep = nice_step((x1 - x0) / 6.0);
  if (xstep < 1.0) xstep = 1.0;
  fr->x0 = x0;
  fr->x1 = x1;
  fr->xstep = xstep;
}

/* The grid, the ticks and their labels, the axes and their labels. */
static void line_axes(FILE *f, const line_frame *fr, const char *xlabel,
                      const char *ylabel) {
  const double L = fr->L, T = fr->T, pw = fr->pw, ph = fr->ph, H = fr->H;
  const double y0 = fr->y0, y1 = fr->y1, ystep = fr->ystep, x0 = fr->x0, x1 = fr->x1,
               xstep = fr->xstep;
  char buf[64];
  int ny = (int)floor((y1 - y0) / ystep + 0.5);
  fputs("<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n", f);
  for (int k = 0; k <= ny; k++) {
    double v = y0 + k * ystep;
    fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", L, pyl(fr, v),
            L + pw, pyl(fr, v));
  }
  fputs("</g>\n", f);
  if (fr->log_y && ph / (y1 - y0) >= 40) { /* 2..9 times each power of ten */
    fputs("<g stroke=\"#f0f0f0\" stroke-width=\"1\">\n", f);
    for (double e = y0; e < y1; e += 1.0)
      for (int m = 2; m <= 9; m++) {
        double yy = pyl(fr, e + log10((double)m));
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", L, yy,
                L + pw, yy);
      }
    fputs("</g>\n", f);
  }
  for (int k = 0; k <= ny; k++) {
    double v = y0 + k * ystep;
    fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n",
            L - 5, pyl(fr, v), L, pyl(fr, v));
    if (fr->log_y)
      snprintf(buf, sizeof buf, "%g", pow(10.0, v));
    else
      format_tick(buf, sizeof buf, v, ystep, fr->ymaxabs);
    text_at(f, L - 8, pyl(fr, v) + 4, "end", 11, NULL, buf);
  }
  double xt0 = ceil(x0 / xstep - 1e-9) * xstep;
  for (int k = 0; xt0 + k * xstep <= x1 + 1e-9; k++) {
    double v = xt0 + k * xstep;
    fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n",
            px(fr, v), T + ph, px(fr, v), T + ph + 5);
    snprintf(buf, sizeof buf, "%.0f", v);
    text_at(f, px(fr, v), T + ph + 18, "middle", 11, NULL, buf);
  }
  fprintf(f,
          "<path d=\"M%.2f %.2f V%.2f H%.2f\" fill=\"none\" stroke=\"black\" "
          "stroke-width=\"1.2\"/>\n",
          L, T, T + ph, L + pw);
  if (xlabel) text_at(f, L + pw / 2, H - 14, "middle", 13, NULL, xlabel);
  if (ylabel) text_at(f, 18, T + ph / 2, "middle", 13, "-90", ylabel);
}

static const char *line_color(const dpt_svg_series *series, int c) {
  return series[c].color ? series[c].color : LINE_COLORS[c % N_LINE_COLORS];
}

/* Curve c: one polyline per run of values that can be drawn; points marked
 * when there are few. */
static void line_curve(FILE *f, const line_frame *fr, const dpt_svg_series *series, int c) {
  const dpt_svg_series *s = &series[c];
  const float *y = s->y;
  int n = s->n, log_y = fr->log_y;
  const char *color = line_color(series, c);
  int open = 0;
  for (int i = 0; i < n; i++) {
    if (!drawable(y[i], log_y) || !isfinite(xof(s, i))) {
      if (open) fputs("\"/>\n", f);
      open = 0;
      continue;
    }
    if (!open)
      fprintf(f,
              "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" "
              "stroke-linejoin=\"round\" points=\"",
              color);
    fprintf(f, "%s%.2f,%.2f", open ? " " : "", px(fr, xof(s, i)), py(fr, (double)y[i]));
    open = 1;
  }
  if (open) fputs("\"/>\n", f);
  if (n <= 40)
    for (int i = 0; i < n; i++)
      if (drawable(y[i], log_y) && isfinite(xof(s, i)))
        fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\"/>\n",
                px(fr, xof(s, i)), py(fr, (double)y[i]), color);
}

/* The legend, top right inside the frame (about 7 px a character at 12 px). */
static void line_legend(FILE *f, const line_frame *fr, const dpt_svg_series *series,
                        int n_series) {
  char buf[64];
  size_t longest = 4;
  for (int c = 0; c < n_series; c++) {
    size_t len = series[c].name ? strlen(series[c].name) : 8;
    if (len > longest) longest = len;
  }
  double lw = 44 + 7.0 * (double)longest, lh = 8 + 18.0 * n_series;
  double lx = fr->L + fr->pw - lw - 8, ly = fr->T + 8;
  fprintf(f,
          "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"white\" "
          "fill-opacity=\"0.85\" stroke=\"#c0c0c0\"/>\n",
          lx, ly, lw, lh);
  for (int c = 0; c < n_series; c++) {
    const char *color = line_color(series, c);
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

dp_status dpt_svg_lines(const char *path, const char *title, const char *xlabel,
                        const char *ylabel, const dpt_svg_series *series, int n_series,
                        int log_y, char *err, size_t errcap) {
  if (!path || !series || n_series < 1)
    return dpt_fail_status(DP_ERR_INVALID, err, errcap,
                           "dpt_svg_lines: need a path and at least one curve (%d)",
                           n_series);
  for (int c = 0; c < n_series; c++)
    if (!series[c].y || series[c].n < 1)
      return dpt_fail_status(DP_ERR_INVALID, err, errcap,
                             "dpt_svg_lines: curve %d needs at least one value (n = %d)", c,
                             series[c].n);

  /* a second title line (after a '\n'), smaller, under the first */
  const char *sub = title ? strchr(title, '\n') : NULL;
  size_t head = title ? (sub ? (size_t)(sub - title) : strlen(title)) : 0;
  if (sub) sub++;
  line_frame fr = {
      .W = 640, .H = 400, .L = 80, .R = 24, .T = sub ? 60 : 44, .B = 56, .log_y = log_y};
  fr.pw = fr.W - fr.L - fr.R;
  fr.ph = fr.H - fr.T - fr.B;
  line_ranges(&fr, series, n_series);

  dp_status s = DP_OK;
  dp_file *out = open_out(path, fr.W, fr.H, err, errcap, &s);
  if (!out) return s;
  FILE *f = dp_file_stream(out);
  if (title) text_atn(f, fr.W / 2, 26, "middle", 16, NULL, title, head);
  if (sub) text_at(f, fr.W / 2, 44, "middle", 11, NULL, sub);
  line_axes(f, &fr, xlabel, ylabel);
  for (int c = 0; c < n_series; c++) line_curve(f, &fr, series, c);
  if (n_series > 1) line_legend(f, &fr, series, n_series);
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

/* What a stacked-bar chart draws: the bars' values and names, the unit and
 * ticks from the tallest bar, the size. */
typedef struct {
  int n_bars, n_segments;
  const char *const *bar_labels, *const *segment_names, *const *segment_colors;
  const double *values;
  int u;           /* the unit: units[u] */
  double scale;    /* bytes per unit */
  double step, y1; /* ticks, top, in units */
  double L, R, T, B, pw, ph, slot, W, H;
} bar_chart;

static const char *const BAR_UNITS[] = {"B", "KiB", "MiB", "GiB", "TiB"};

static double bar_value(const bar_chart *c, int b, int s) {
  return c->values[(size_t)b * (size_t)c->n_segments + (size_t)s];
}
static const char *bar_color(const bar_chart *c, int s) {
  return c->segment_colors && c->segment_colors[s] ? c->segment_colors[s]
                                                   : PALETTE[s % N_PALETTE];
}
static double bar_py(const bar_chart *c, double v) { /* v in units */
  return c->T + c->ph - v / c->y1 * c->ph;
}

/* The unit from the tallest bar (top bytes), nice ticks in that unit; the
 * legend as wide as its longest entry (about 7 px a character at 12 px); the
 * size. */
static void bar_layout(bar_chart *c, const char *title, double top) {
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
  c->u = u;
  c->scale = scale;
  c->step = step;
  c->y1 = ceil(top_u / step - 1e-9) * step;

  int n_bars = c->n_bars, n_segments = c->n_segments;
  size_t longest = 12;
  for (int s = 0; s < n_segments; s++) {
    size_t len = c->segment_names && c->segment_names[s] ? strlen(c->segment_names[s]) : 10;
    if (only_first(c->values, n_bars, n_segments, s))
      len += 8 + (c->bar_labels && c->bar_labels[0] ? strcspn(c->bar_labels[0], "\n") : 5);
    if (len > longest) longest = len;
  }
  c->L = 90, c->R = 20, c->T = 44, c->B = 60;
  const double LEGEND = 40 + 7.0 * (double)longest;
  c->slot = n_bars <= 4 ? 110 : 80;
  c->pw = c->slot * n_bars, c->ph = 300;
  c->W = c->L + c->pw + c->R + LEGEND;
  if (title && c->W < 9.0 * (double)strlen(title) + 40)
    c->W = 9.0 * (double)strlen(title) + 40;
  c->H = c->T + c->ph + c->B;
  int n_legend = 0;
  for (int s = 0; s < n_segments; s++)
    for (int b = 0; b < n_bars; b++)
      if (bar_value(c, b, s) > 0.0) {
        n_legend++;
        break;
      }
  if (c->T + 20 + 18.0 * n_legend > c->H) c->H = c->T + 20 + 18.0 * n_legend;
}

/* The y ticks with their labels, and the axes. */
static void bar_axes(FILE *f, const bar_chart *c) {
  char buf[64];
  int nt = (int)floor(c->y1 / c->step + 0.5);
  for (int k = 0; k <= nt; k++) {
    double v = k * c->step;
    fprintf(f,
            "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#e0e0e0\"/>\n",
            c->L, bar_py(c, v), c->L + c->pw, bar_py(c, v));
    fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n",
            c->L - 5, bar_py(c, v), c->L, bar_py(c, v));
    snprintf(buf, sizeof buf, "%.*f %s", step_decimals(c->step), v, BAR_UNITS[c->u]);
    text_at(f, c->L - 8, bar_py(c, v) + 4, "end", 11, NULL, buf);
  }
  fprintf(f,
          "<path d=\"M%.2f %.2f V%.2f H%.2f\" fill=\"none\" stroke=\"black\" "
          "stroke-width=\"1.2\"/>\n",
          c->L, c->T, c->T + c->ph, c->L + c->pw);
}

/* Bar b: its segments stacked, its total above it, its label under it. */
static void bar_draw(FILE *f, const bar_chart *c, int b) {
  char buf[64], lab[64];
  const char *const *names = c->segment_names;
  double bx = c->L + c->slot * b + c->slot * 0.2, bw = c->slot * 0.6;
  double acc = 0.0;
  for (int s = 0; s < c->n_segments; s++) {
    double v = bar_value(c, b, s);
    if (v <= 0.0) continue;
    double ya = bar_py(c, (acc + v) / c->scale), yb = bar_py(c, acc / c->scale);
    fprintf(f,
            "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" "
            "stroke=\"white\" stroke-width=\"0.5\"><title>",
            bx, ya, bw, yb - ya, bar_color(c, s));
    if (names && names[s])
      put_text(f, names[s]);
    else
      fprintf(f, "segment %d", s);
    fprintf(f, ": %s (%.0f B)</title></rect>\n", dpt_format_bytes(v, buf, sizeof buf), v);
    /* what only the first bar holds, named on it where the segment is tall enough */
    if (b == 0 && yb - ya >= 11 && names && names[s] &&
        6.0 * (double)strlen(names[s]) <= bw - 4 &&
        only_first(c->values, c->n_bars, c->n_segments, s)) {
      fprintf(f,
              "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\" "
              "fill=\"white\" %s>",
              bx + bw / 2, (ya + yb) / 2 + 4, FONT);
      put_text(f, names[s]);
      fputs("</text>\n", f);
    }
    acc += v;
  }
  text_at(f, bx + bw / 2, bar_py(c, acc / c->scale) - 6, "middle", 10, NULL,
          dpt_format_bytes(acc, buf, sizeof buf));
  const char *label = c->bar_labels ? c->bar_labels[b] : NULL;
  double ly = c->T + c->ph;
  if (label) {
    /* a second line after a newline, smaller, under the first */
    const char *nl = strchr(label, '\n');
    snprintf(lab, sizeof lab, "%.*s", nl ? (int)(nl - label) : (int)strlen(label), label);
    text_at(f, bx + bw / 2, ly + 18, "middle", 12, NULL, lab);
    if (nl) text_at(f, bx + bw / 2, ly + 33, "middle", 11, NULL, nl + 1);
  } else {
    snprintf(lab, sizeof lab, "dev %d", b);
    text_at(f, bx + bw / 2, ly + 18, "middle", 12, NULL, lab);
  }
}

/* The legend: top to bottom in stacking order, bottom segment last (as drawn). */
static void bar_legend(FILE *f, const bar_chart *c) {
  const char *const *bar_labels = c->bar_labels;
  double lx = c->L + c->pw + c->R + 10, ly = c->T + 10;
  int row = 0;
  for (int s = c->n_segments - 1; s >= 0; s--) {
    int used = 0;
    for (int b = 0; b < c->n_bars; b++)
      if (bar_value(c, b, s) > 0.0) used = 1;
    if (!used) continue;
    double yy = ly + 18.0 * row++;
    fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", lx,
            yy, bar_color(c, s));
    char name[96];
    if (c->segment_names && c->segment_names[s])
      snprintf(name, sizeof name, "%s", c->segment_names[s]);
    else
      snprintf(name, sizeof name, "segment %d", s);
    if (only_first(c->values, c->n_bars, c->n_segments, s)) {
      size_t len = strlen(name);
      int first = bar_labels && bar_labels[0] ? (int)strcspn(bar_labels[0], "\n") : 5;
      snprintf(name + len, sizeof name - len, " (only %.*s)", first,
               bar_labels && bar_labels[0] ? bar_labels[0] : "dev 0");
    }
    text_at(f, lx + 18, yy + 10, "start", 12, NULL, name);
  }
}

dp_status dpt_svg_stacked_bars(const char *path, const char *title, int n_bars,
                               const char *const *bar_labels, int n_segments,
                               const char *const *segment_names,
                               const char *const *segment_colors, const double *values,
                               char *err, size_t errcap) {
  return dpt_svg_stacked_bars_limit(path, title, n_bars, bar_labels, n_segments,
                                    segment_names, segment_colors, values, 0.0, NULL, err,
                                    errcap);
}

/* The limit's dashed line across the plot, its label at the right end above it. */
static void bar_limit(FILE *f, const bar_chart *c, double limit, const char *label) {
  double y = bar_py(c, limit / c->scale);
  fprintf(f,
          "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#d62728\" "
          "stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n",
          c->L, y, c->L + c->pw, y);
  if (!label) return;
  fprintf(f,
          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\" %s "
          "fill=\"#d62728\">",
          c->L + c->pw - 4, y - 5, FONT);
  put_text(f, label);
  fputs("</text>\n", f);
}

dp_status dpt_svg_stacked_bars_limit(const char *path, const char *title, int n_bars,
                                     const char *const *bar_labels, int n_segments,
                                     const char *const *segment_names,
                                     const char *const *segment_colors,
                                     const double *values, double limit,
                                     const char *limit_label, char *err, size_t errcap) {
  if (!path || !values || n_bars < 1 || n_segments < 1)
    return dpt_fail_status(DP_ERR_INVALID, err, errcap,
                           "dpt_svg_stacked_bars: need a path, values and at least one bar "
                           "and segment (bars %d, segments %d)",
                           n_bars, n_segments);
  double top = 0.0;
  for (int b = 0; b < n_bars; b++) {
    double t = 0.0;
    for (int s = 0; s < n_segments; s++) {
      double v = values[(size_t)b * (size_t)n_segments + (size_t)s];
      if (!(v >= 0.0) || !isfinite(v))
        return dpt_fail_status(DP_ERR_INVALID, err, errcap,
                               "dpt_svg_stacked_bars: bar %d segment %d: value %g is not a "
                               "finite byte count >= 0",
                               b, s, v);
      t += v;
    }
    if (t > top) top = t;
  }
  if (!(limit >= 0.0) || !isfinite(limit))
    return dpt_fail_status(DP_ERR_INVALID, err, errcap,
                           "dpt_svg_stacked_bars: limit %g is not a finite byte count >= 0",
                           limit);
  if (limit > top) top = limit;
  bar_chart c = {.n_bars = n_bars,
                 .n_segments = n_segments,
                 .bar_labels = bar_labels,
                 .segment_names = segment_names,
                 .segment_colors = segment_colors,
                 .values = values};
  bar_layout(&c, title, top);

  dp_status st = DP_OK;
  dp_file *out = open_out(path, c.W, c.H, err, errcap, &st);
  if (!out) return st;
  FILE *f = dp_file_stream(out);
  if (title) text_at(f, c.W / 2, 26, "middle", 16, NULL, title);
  bar_axes(f, &c);
  for (int b = 0; b < n_bars; b++) bar_draw(f, &c, b);
  if (limit > 0.0) bar_limit(f, &c, limit, limit_label);
  bar_legend(f, &c);
  fputs("</svg>\n", f);
  return finish(out, err, errcap);
}

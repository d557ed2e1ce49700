/* plot.c - a standalone SVG line chart: axes with "nice" ticks (1, 2, 5
 * times a power of ten), a light grid, one polyline per series and a
 * legend.  Hand-written SVG, no dependencies; `gradc train --plot` draws
 * its loss curves with it.  A series of more than SMOOTH_MIN points is drawn
 * twice: faintly as it is, and on top as a centred moving average over
 * about 1/SMOOTH_DIV of its points, so a noisy loss shows its trend.  Long
 * series are thinned to at most MAX_POINTS points per line (every k-th
 * point and the last).  The file is written atomically (write_file_atomic). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cli.h"
#include "tools.h"

enum { WIDTH = 820, HEIGHT = 480, LEFT = 78, RIGHT = 170, TOP = 44, BOTTOM = 56, MAX_POINTS = 2000, SMOOTH_MIN = 200,
       SMOOTH_DIV = 50 };

static const char *palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

typedef struct Axis {
  double lo, hi, step; /* the drawn range, a whole number of ticks */
} Axis;

/* A tick spacing of 1, 2 or 5 times a power of ten giving about n ticks. */
static double nice_step(double range, int n) {
  double raw = range / n, mag = pow(10, floor(log10(raw))), r = raw / mag;
  return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
}

static Axis make_axis(double lo, double hi, int n) {
  if (!(hi > lo)) {
    double pad = lo != 0 ? fabs(lo) * 0.1 : 1;
    lo -= pad;
    hi += pad;
  }
  Axis a;
  a.step = nice_step(hi - lo, n);
  a.lo = floor(lo / a.step) * a.step;
  a.hi = ceil(hi / a.step) * a.step;
  if (a.hi <= a.lo) a.hi = a.lo + a.step;
  return a;
}

static void put_escaped(FILE *out, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '<': fputs("&lt;", out); break;
    case '>': fputs("&gt;", out); break;
    case '&': fputs("&amp;", out); break;
    case '"': fputs("&quot;", out); break;
    default:
      if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, out);
    }
  }
}

/* A tick label: at most 4 significant digits, no "-0". */
static void tick_label(char *buf, size_t n, double v, double step) {
  if (fabs(v) < step * 1e-9) v = 0;
  snprintf(buf, n, "%.4g", v);
}

/* One series as polylines (a break at each non-finite point). */
static void polyline(FILE *out, const double *x, const double *y, int n, const Axis *ax, const Axis *ay, double pw,
                     double ph) {
  int stride = n > MAX_POINTS ? (n + MAX_POINTS - 1) / MAX_POINTS : 1;
  bool open = false;
  for (int j = 0; j < n; j++) {
    if (j % stride != 0 && j != n - 1) continue;
    if (!isfinite(x[j]) || !isfinite(y[j])) {
      if (open) fprintf(out, "\"/>\n");
      open = false;
      continue;
    }
    double px = LEFT + (x[j] - ax->lo) / (ax->hi - ax->lo) * pw, py = TOP + ph - (y[j] - ay->lo) / (ay->hi - ay->lo) * ph;
    fprintf(out, "%s%.2f,%.2f", open ? " " : "<polyline points=\"", px, py);
    open = true;
  }
  if (open) fprintf(out, "\"/>\n");
}

/* The centred moving average of y over 2h+1 points (fewer at the ends),
 * skipping non-finite values; malloc'd. */
static double *moving_average(const double *y, int n, int h) {
  double *sum = mem_calloc((size_t)n + 1, sizeof *sum), *out = mem_alloc(sizeof *out * (size_t)n);
  int *cnt = mem_calloc((size_t)n + 1, sizeof *cnt);
  for (int i = 0; i < n; i++) {
    bool ok = isfinite(y[i]);
    sum[i + 1] = sum[i] + (ok ? y[i] : 0);
    cnt[i + 1] = cnt[i] + ok;
  }
  for (int i = 0; i < n; i++) {
    int a = i - h < 0 ? 0 : i - h, b = i + h + 1 > n ? n : i + h + 1;
    out[i] = isfinite(y[i]) && cnt[b] > cnt[a] ? (sum[b] - sum[a]) / (cnt[b] - cnt[a]) : NAN;
  }
  free(sum);
  free(cnt);
  return out;
}

static void write_chart(FILE *out, const char *title, const char *xlabel, const char *ylabel, const PlotSeries *s,
                        int ns) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (int i = 0; i < ns; i++)
    for (int j = 0; j < s[i].n; j++) {
      if (!isfinite(s[i].x[j]) || !isfinite(s[i].y[j])) continue;
      xmin = fmin(xmin, s[i].x[j]);
      xmax = fmax(xmax, s[i].x[j]);
      ymin = fmin(ymin, s[i].y[j]);
      ymax = fmax(ymax, s[i].y[j]);
    }
  if (!isfinite(xmin)) xmin = 0, xmax = 1, ymin = 0, ymax = 1; /* nothing to draw: empty axes */
  Axis ax = make_axis(xmin, xmax, 8), ay = make_axis(ymin, ymax, 6);
  double pw = WIDTH - LEFT - RIGHT, ph = HEIGHT - TOP - BOTTOM;
#define PX(v) (LEFT + ((v) - ax.lo) / (ax.hi - ax.lo) * pw)
#define PY(v) (TOP + ph - ((v) - ay.lo) / (ay.hi - ay.lo) * ph)

  fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  fprintf(out,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
          "font-family=\"sans-serif\" font-size=\"12\">\n",
          WIDTH, HEIGHT, WIDTH, HEIGHT);
  fprintf(out, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", WIDTH, HEIGHT);
  fprintf(out, "<text x=\"%g\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">", LEFT + pw / 2);
  put_escaped(out, title);
  fprintf(out, "</text>\n");

  /* Grid and ticks. */
  fprintf(out, "<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n");
  int nx = (int)llround((ax.hi - ax.lo) / ax.step), ny = (int)llround((ay.hi - ay.lo) / ay.step);
  for (int i = 0; i <= nx; i++) {
    double x = PX(ax.lo + i * ax.step);
    fprintf(out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%.2f\"/>\n", x, TOP, x, TOP + ph);
  }
  for (int i = 0; i <= ny; i++) {
    double y = PY(ay.lo + i * ay.step);
    fprintf(out, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", LEFT, y, LEFT + pw, y);
  }
  fprintf(out, "</g>\n<g fill=\"#333\">\n");
  char buf[64];
  for (int i = 0; i <= nx; i++) {
    double v = ax.lo + i * ax.step;
    tick_label(buf, sizeof buf, v, ax.step);
    fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%s</text>\n", PX(v), TOP + ph + 18, buf);
  }
  for (int i = 0; i <= ny; i++) {
    double v = ay.lo + i * ay.step;
    tick_label(buf, sizeof buf, v, ay.step);
    fprintf(out, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n", LEFT - 8, PY(v) + 4, buf);
  }
  fprintf(out, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">", LEFT + pw / 2, HEIGHT - 14);
  put_escaped(out, xlabel);
  fprintf(out, "</text>\n<text x=\"18\" y=\"%.2f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.2f)\">",
          TOP + ph / 2, TOP + ph / 2);
  put_escaped(out, ylabel);
  fprintf(out, "</text>\n</g>\n");
  fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" stroke=\"#333\"/>\n", LEFT, TOP,
          pw, ph);

  /* Each series: faint raw values under the moving average when long. */
  for (int i = 0; i < ns; i++) {
    const char *color = s[i].emphasis ? "#000000" : palette[i % (int)(sizeof palette / sizeof *palette)];
    const char *dash = s[i].emphasis ? " stroke-dasharray=\"6 3\"" : "";
    if (s[i].n > SMOOTH_MIN) {
      fprintf(out, "<g fill=\"none\" stroke=\"%s\" stroke-width=\"1\" stroke-opacity=\"0.25\">\n", color);
      polyline(out, s[i].x, s[i].y, s[i].n, &ax, &ay, pw, ph);
      fprintf(out, "</g>\n");
    }
    double *avg = s[i].n > SMOOTH_MIN ? moving_average(s[i].y, s[i].n, s[i].n / SMOOTH_DIV / 2) : NULL;
    fprintf(out, "<g fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s stroke-linejoin=\"round\">\n", color,
            s[i].emphasis ? "2" : "1.5", dash);
    polyline(out, s[i].x, avg ? avg : s[i].y, s[i].n, &ax, &ay, pw, ph);
    fprintf(out, "</g>\n");
    free(avg);
  }

  /* Legend, right of the plot. */
  for (int i = 0; i < ns; i++) {
    const char *color = s[i].emphasis ? "#000000" : palette[i % (int)(sizeof palette / sizeof *palette)];
    double y = TOP + 10 + i * 20, x = LEFT + pw + 16;
    fprintf(out, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"%s\"%s/>\n", x,
            y, x + 24, y, color, s[i].emphasis ? "2" : "1.5", s[i].emphasis ? " stroke-dasharray=\"6 3\"" : "");
    fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" fill=\"#333\">", x + 30, y + 4);
    put_escaped(out, s[i].name);
    fprintf(out, "</text>\n");
  }
  bool smoothed = false;
  for (int i = 0; i < ns; i++) smoothed |= s[i].n > SMOOTH_MIN;
  if (smoothed) {
    int n = 0;
    for (int i = 0; i < ns; i++)
      if (s[i].n > n) n = s[i].n;
    fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" fill=\"#777\" font-size=\"11\">lines: mean of %d steps</text>\n",
            LEFT + pw + 16, TOP + 10 + ns * 20 + 6.0, 2 * (n / SMOOTH_DIV / 2) + 1);
  }
  fprintf(out, "</svg>\n");
#undef PX
#undef PY
}

bool plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel, const PlotSeries *s,
              int ns, char *err, size_t errlen) {
  char *svg = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&svg, &len);
  if (!out) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return false;
  }
  write_chart(out, title, xlabel, ylabel, s, ns);
  bool ok = !ferror(out);
  if (fclose(out) != 0) ok = false;
  if (!ok) snprintf(err, errlen, "%s: %s", path, strerror(errno ? errno : ENOMEM));
  else ok = write_file_atomic(path, &(FilePart){svg, len}, 1, err, errlen);
  free(svg);
  return ok;
}

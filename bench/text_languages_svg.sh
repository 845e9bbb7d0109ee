#!/usr/bin/env bash
# A bar chart of bench/text_accuracy.sh's languages.txt: for each language the
# final test bits per byte of each strategy (left panel) and its generalist
# routing share (right panel).
#   bench/text_languages_svg.sh LANGUAGES_TXT OUT.svg
set -euo pipefail
in=$1 out=$2
awk '
  NR == 1 { k = 0; for (i = 2; i <= NF; i++) if ($i !~ /^gen:/) name[++k] = $i; next }
  { n++; lang[n] = $1; for (j = 1; j <= k; j++) { b[n, j] = $(1 + j); g[n, j] = $(1 + k + j) } }
  END {
    split("#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd", col, " ")
    W = 1100; H = 420; pw = 500; ph = 300; top = 50; left[1] = 60; left[2] = 600
    # the bits-per-byte axis spans the data (strategies differ by tenths), in halves
    hi = 0; lo = 99
    for (i = 1; i <= n; i++) for (j = 1; j <= k; j++) if (b[i, j] != "-") { if (b[i, j] > hi) hi = b[i, j]; if (b[i, j] < lo) lo = b[i, j] }
    hi = int(hi * 2 + 1) / 2; lo = int(lo * 2) / 2 - 0.5; if (lo < 0) lo = 0
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
    printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
    for (p = 1; p <= 2; p++) {
      x0 = left[p]; top_v = p == 1 ? hi : 1; bot = p == 1 ? lo : 0
      printf "<text x=\"%d\" y=\"30\" font-size=\"14\">%s</text>\n", x0, p == 1 ? "final test bits per byte (lower is better)" : "generalist routing share"
      for (t = 0; t <= 4; t++) {
        v = bot + (top_v - bot) * t / 4; y = top + ph - ph * t / 4
        printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x0, y, x0 + pw, y
        printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", x0 - 4, y + 4, v
      }
      gw = pw / n; bw = (gw - 10) / k
      for (i = 1; i <= n; i++) {
        for (j = 1; j <= k; j++) {
          v = p == 1 ? b[i, j] : g[i, j]
          if (v == "-") continue
          h = ph * (v - bot) / (top_v - bot); x = x0 + (i - 1) * gw + 5 + (j - 1) * bw
          printf "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>%s %s: %s</title></rect>\n", x, top + ph - h, bw - 1, h, col[j], lang[i], name[j], v
        }
        printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x0 + (i - 0.5) * gw, top + ph + 16, lang[i]
      }
    }
    for (j = 1; j <= k; j++) {
      printf "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>", 60 + (j - 1) * 120, H - 30, col[j]
      printf "<text x=\"%d\" y=\"%d\">%s</text>\n", 76 + (j - 1) * 120, H - 20, name[j]
    }
    print "</svg>"
  }' "$in" > "$out"
echo "wrote $out" >&2

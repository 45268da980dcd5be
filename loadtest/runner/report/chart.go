package report

import (
	"fmt"
	"html/template"
	"math"
	"strings"
)

var nan = math.NaN()

// series is one set of bars: one value per row, NaN where not measured.
type series struct {
	name   string
	color  string
	values []float64
}

// hbars draws a horizontal grouped bar chart as inline SVG: one group per
// row label, one bar per series. It is a few dozen lines of SVG rather than
// a charting library because the report must open from a file on a machine
// with no network: nothing may be fetched.
func hbars(title, unit string, labels []string, ss []series, width int) template.HTML {
	const (
		labelW = 118
		valueW = 74
		gap    = 6
	)
	// Grouped bars are thinner, so that eleven rows of three still fit
	// on one screen next to the table.
	barH, top := 12, 26
	if len(ss) > 1 {
		barH, top = 11, 40
	}
	groupH := len(ss)*barH + gap
	height := top + len(labels)*groupH + 8
	plotW := float64(width - labelW - valueW)
	peak := 0.0
	for _, s := range ss {
		for _, v := range s.values {
			if !math.IsNaN(v) {
				peak = math.Max(peak, v)
			}
		}
	}
	if peak == 0 {
		peak = 1 // all zero: draw empty bars, which is the point of a lock row
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		width, height, width, height, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<text x="0" y="15" class="title">%s</text>`, template.HTMLEscapeString(title))
	if len(ss) > 1 {
		x := labelW
		for _, s := range ss {
			fmt.Fprintf(&b, `<rect x="%d" y="23" width="10" height="10" fill="%s"/><text x="%d" y="32" class="legend">%s</text>`,
				x, s.color, x+14, template.HTMLEscapeString(s.name))
			x += 14 + 8*len(s.name) + 16
		}
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/>`, labelW, top-4, labelW, height-6)
	for i, label := range labels {
		y0 := top + i*groupH
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="label" text-anchor="end">%s</text>`,
			labelW-6, y0+len(ss)*barH/2+4, template.HTMLEscapeString(label))
		for j, s := range ss {
			y := y0 + j*barH
			v := nan
			if i < len(s.values) {
				v = s.values[i]
			}
			if math.IsNaN(v) {
				fmt.Fprintf(&b, `<text x="%d" y="%d" class="value na">—</text>`, labelW+4, y+barH-2)
				continue
			}
			w := plotW * v / peak
			if v > 0 && w < 1.5 {
				w = 1.5 // a non-zero value must stay visible next to a zero
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %s</title></rect>`,
				labelW, y, w, barH-2, s.color, template.HTMLEscapeString(label), template.HTMLEscapeString(s.name), number(v, unit))
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="value">%s</text>`, float64(labelW)+w+4, y+barH-2, number(v, unit))
		}
	}
	b.WriteString(`</svg>`)
	// Safe to mark as HTML: every string in it went through HTMLEscapeString.
	return template.HTML(b.String())
}

func number(v float64, unit string) string {
	var s string
	switch {
	case v == math.Trunc(v) && math.Abs(v) < 1e9:
		s = fmt.Sprintf("%.0f", v)
	case v >= 100:
		s = fmt.Sprintf("%.0f", v)
	default:
		s = fmt.Sprintf("%.1f", v)
	}
	if unit != "" {
		s += " " + unit
	}
	return s
}

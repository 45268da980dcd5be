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

const (
	labelW = 118 // the row names, right-aligned against the axis
	valueW = 74  // room for the value printed after the longest bar
	gap    = 6   // between two rows' groups of bars
)

// chart is the geometry of one bar chart.
type chart struct {
	unit              string
	barH, top, groupH int
	width, height     int
	plotW, peak       float64
}

// hbars draws a horizontal grouped bar chart as inline SVG: one group per
// row label, one bar per series. It is a few dozen lines of SVG rather than
// a charting library because the report must open from a file on a machine
// with no network: nothing may be fetched.
func hbars(title, unit string, labels []string, ss []series, width int) template.HTML {
	c := newChart(unit, len(labels), ss, width)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		width, c.height, width, c.height, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<text x="0" y="15" class="title">%s</text>`, template.HTMLEscapeString(title))
	if len(ss) > 1 {
		drawLegend(&b, ss)
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/>`, labelW, c.top-4, labelW, c.height-6)
	for i, label := range labels {
		y0 := c.top + i*c.groupH
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="label" text-anchor="end">%s</text>`,
			labelW-6, y0+len(ss)*c.barH/2+4, template.HTMLEscapeString(label))
		for j, s := range ss {
			c.bar(&b, label, s, i, y0+j*c.barH)
		}
	}
	b.WriteString(`</svg>`)
	// Safe to mark as HTML: every string in it went through HTMLEscapeString.
	return template.HTML(b.String())
}

func newChart(unit string, rows int, ss []series, width int) chart {
	// Grouped bars are thinner, so that twelve rows of three still fit
	// on one screen next to the table.
	c := chart{unit: unit, barH: 12, top: 26, width: width, plotW: float64(width - labelW - valueW)}
	if len(ss) > 1 {
		c.barH, c.top = 11, 40
	}
	c.groupH = len(ss)*c.barH + gap
	c.height = c.top + rows*c.groupH + 8
	for _, s := range ss {
		for _, v := range s.values {
			if !math.IsNaN(v) {
				c.peak = math.Max(c.peak, v)
			}
		}
	}
	if c.peak == 0 {
		c.peak = 1 // all zero: draw empty bars, which is the point of a lock row
	}
	return c
}

func drawLegend(b *strings.Builder, ss []series) {
	x := labelW
	for _, s := range ss {
		fmt.Fprintf(b, `<rect x="%d" y="23" width="10" height="10" fill="%s"/><text x="%d" y="32" class="legend">%s</text>`,
			x, s.color, x+14, template.HTMLEscapeString(s.name))
		x += 14 + 8*len(s.name) + 16
	}
}

// bar draws row i's bar of series s at height y, with its value after it;
// a dash where the row measured nothing.
func (c chart) bar(b *strings.Builder, label string, s series, i, y int) {
	v := nan
	if i < len(s.values) {
		v = s.values[i]
	}
	if math.IsNaN(v) {
		fmt.Fprintf(b, `<text x="%d" y="%d" class="value na">—</text>`, labelW+4, y+c.barH-2)
		return
	}
	w := c.plotW * v / c.peak
	if v > 0 && w < 1.5 {
		w = 1.5 // a non-zero value must stay visible next to a zero
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %s</title></rect>`,
		labelW, y, w, c.barH-2, s.color, template.HTMLEscapeString(label), template.HTMLEscapeString(s.name), number(v, c.unit))
	fmt.Fprintf(b, `<text x="%.1f" y="%d" class="value">%s</text>`, float64(labelW)+w+4, y+c.barH-2, number(v, c.unit))
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

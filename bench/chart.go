package main

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"text/template"
)

// series are the chart's lines: row id, label, colour, dashed.
var series = []struct {
	id, label, color string
	dashed           bool
}{
	{"1a", "leasefs lease cycle (1a)", "#1f77b4", false},
	{"1c", "leasefs handle-lease cycle (1c)", "#17becf", false},
	{"3a", "go-fuse in-memory ceiling (3a)", "#7f7f7f", true},
	{"5d", "etcd Mutex, distinct keys (5d)", "#2ca02c", false},
	{"9a", "leasefs on etcd, lease cycle (9a)", "#9467bd", false},
	{"6a", "Redis appendfsync always (6a)", "#d62728", false},
	{"6e", "Redis appendfsync everysec (6e)", "#ff7f0e", true},
}

// chartTmpl is the SVG of the throughput chart; chartData fills it.
var chartTmpl = template.Must(template.New("chart").Parse(`<svg xmlns="http://www.w3.org/2000/svg" width="{{.W}}" height="{{.H}}" viewBox="0 0 {{.W}} {{.H}}" font-family="sans-serif" font-size="12">
<rect width="{{.W}}" height="{{.H}}" fill="white"/>
<text x="{{.Left}}" y="22" font-size="15" font-weight="bold">Throughput against concurrent clients (log–log)</text>
{{range .YTicks}}<line x1="{{$.Left}}" y1="{{printf "%.1f" .Y}}" x2="{{$.Right}}" y2="{{printf "%.1f" .Y}}" stroke="{{if .Label}}#cccccc{{else}}#eeeeee{{end}}"/>
{{if .Label}}<text x="{{$.LabelX}}" y="{{printf "%.1f" .Y}}" text-anchor="end" dominant-baseline="middle">{{.Label}}</text>
{{end}}{{end}}{{range .XTicks}}<line x1="{{printf "%.1f" .X}}" y1="{{$.Top}}" x2="{{printf "%.1f" .X}}" y2="{{$.Bottom}}" stroke="#cccccc"/>
<text x="{{printf "%.1f" .X}}" y="{{$.XLabelY}}" text-anchor="middle">{{.Label}}</text>
{{end}}<rect x="{{.Left}}" y="{{.Top}}" width="{{.PlotW}}" height="{{.PlotH}}" fill="none" stroke="#333333"/>
<text x="{{.MidX}}" y="{{.XTitleY}}" text-anchor="middle">concurrent clients</text>
<text transform="translate(20 {{.MidY}}) rotate(-90)" text-anchor="middle">cycles per second</text>
{{range $s := .Series}}<polyline points="{{.Points}}" fill="none" stroke="{{.Color}}" stroke-width="2"{{if .Dashed}} stroke-dasharray="6 4"{{end}}/>
{{range .Dots}}<circle cx="{{printf "%.1f" .X}}" cy="{{printf "%.1f" .Y}}" r="3" fill="{{$s.Color}}"/>
{{end}}<line x1="{{$.LegendX}}" y1="{{.LY}}" x2="{{$.LegendX2}}" y2="{{.LY}}" stroke="{{.Color}}" stroke-width="2"{{if .Dashed}} stroke-dasharray="6 4"{{end}}/>
<text x="{{$.LegendTX}}" y="{{.LY}}" dominant-baseline="middle">{{.Label}}</text>
{{end}}</svg>
`))

type chartPoint struct{ X, Y float64 }

type chartTick struct {
	X, Y  float64
	Label string
}

type chartSeries struct {
	Points, Color, Label string
	Dashed               bool
	Dots                 []chartPoint
	LY                   int
}

type chartData struct {
	W, H, Left, Right, Top, Bottom, PlotW, PlotH int
	LabelX, XLabelY, MidX, MidY, XTitleY         int
	LegendX, LegendX2, LegendTX                  int
	YTicks, XTicks                               []chartTick
	Series                                       []chartSeries
}

// chart draws throughput against clients, both axes logarithmic.
func (r report) chart() ([]byte, error) {
	const maxClients = 64.0
	d := chartData{W: 760, H: 460, Left: 80, Top: 40}
	d.PlotW, d.PlotH = d.W-d.Left-250, d.H-d.Top-60
	d.Right, d.Bottom = d.Left+d.PlotW, d.Top+d.PlotH
	d.LabelX, d.XLabelY, d.MidX, d.MidY, d.XTitleY = d.Left-8, d.Bottom+18, d.Left+d.PlotW/2, d.Top+d.PlotH/2, d.H-18
	d.LegendX = d.Right + 15
	d.LegendX2, d.LegendTX = d.LegendX+24, d.LegendX+30
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, x := range r.rows {
			if x.id == s.id && x.ops > 0 {
				lo, hi = math.Min(lo, x.ops), math.Max(hi, x.ops)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi <= dlo {
		dhi = dlo + 1
	}
	xOf := func(c int) float64 {
		return float64(d.Left) + math.Log(float64(c))/math.Log(maxClients)*float64(d.PlotW)
	}
	yOf := func(v float64) float64 { return float64(d.Top) + (dhi-math.Log10(v))/(dhi-dlo)*float64(d.PlotH) }
	for e := dlo; e <= dhi; e++ {
		for _, m := range []float64{1, 2, 5} {
			if e == dhi && m > 1 {
				break
			}
			t := chartTick{Y: yOf(m * math.Pow(10, e))}
			if m == 1 {
				t.Label = siCount(math.Pow(10, e))
			}
			d.YTicks = append(d.YTicks, t)
		}
	}
	for _, c := range clientCounts {
		d.XTicks = append(d.XTicks, chartTick{X: xOf(c), Label: fmt.Sprint(c)})
	}
	ly := d.Top + 10
	for _, s := range series {
		cs := chartSeries{Color: s.color, Label: s.label, Dashed: s.dashed, LY: ly}
		var pts []string
		for _, c := range clientCounts {
			if x, ok := findRow(r.rows, s.id, c); ok && x.ops > 0 {
				p := chartPoint{X: xOf(c), Y: yOf(x.ops)}
				cs.Dots = append(cs.Dots, p)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", p.X, p.Y))
			}
		}
		if len(pts) == 0 {
			continue
		}
		cs.Points = strings.Join(pts, " ")
		d.Series = append(d.Series, cs)
		ly += 20
	}
	var b bytes.Buffer
	if err := chartTmpl.Execute(&b, d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// siCount prints a count as 1, 10, 100, 1k, 10k …
func siCount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	default:
		return fmt.Sprintf("%g", v)
	}
}

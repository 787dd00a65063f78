package cli

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/mattn/go-runewidth"
)

// TestTableMatchesTabwriter checks that the table of "ls" and "history"
// lays out exactly as text/tabwriter with padding 2 did, for cells of
// every width, multibyte runes of one column included.
func TestTableMatchesTabwriter(t *testing.T) {
	pinEastAsianWidth(t, false)
	rows := [][]string{
		{"RESOURCE", "MODE", "UID", "EXPIRES IN"},
		{"a", "token", "0", "4m59s"},
		{"ci/deploy-äöü", "handle", "1000", "-"},
		{strings.Repeat("x", 40), "token", "4294967295", "999h59m59s"},
		{"", "", "", ""},
	}
	var want bytes.Buffer
	tw := tabwriter.NewWriter(&want, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	tb := newTable(len(rows), rows[0]...)
	for _, r := range rows[1:] {
		for _, c := range r {
			tb.text(c)
		}
	}
	var got bytes.Buffer
	if err := tb.write(&got); err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Fatalf("table:\n%q\ntabwriter:\n%q", got.String(), want.String())
	}
}

// pinEastAsianWidth sets how go-runewidth measures East Asian ambiguous
// characters (such as ±) for the test: it follows the locale otherwise.
func pinEastAsianWidth(t *testing.T, wide bool) {
	old := runewidth.DefaultCondition.EastAsianWidth
	runewidth.DefaultCondition.EastAsianWidth = wide
	t.Cleanup(func() { runewidth.DefaultCondition.EastAsianWidth = old })
}

// TestTableAlignsByDisplayWidth: columns line up on a terminal when a name
// holds wide CJK characters (two columns each), a combining accent or a
// byte order mark (none), and East Asian ambiguous characters take two
// columns under a CJK locale.
func TestTableAlignsByDisplayWidth(t *testing.T) {
	// The first column is 11 terminal columns wide (ci/デプロイ), plus 2.
	for _, tc := range []struct {
		wide bool
		want string
	}{
		{false, "RESOURCE     MODE\n" +
			"ci/デプロイ  token\n" + // 3 + 4×2 columns
			"cafe\u0301" + strings.Repeat(" ", 9) + "token\n" + // the accent combines with e
			"\ufeffbom" + strings.Repeat(" ", 10) + "token\n" + // the byte order mark takes none
			"±°" + strings.Repeat(" ", 11) + "token\n"},
		{true, "RESOURCE     MODE\n" +
			"ci/デプロイ  token\n" +
			"cafe\u0301" + strings.Repeat(" ", 9) + "token\n" +
			"\ufeffbom" + strings.Repeat(" ", 10) + "token\n" +
			"±°" + strings.Repeat(" ", 9) + "token\n"}, // ambiguous: two columns each
	} {
		pinEastAsianWidth(t, tc.wide)
		tb := newTable(4, "RESOURCE", "MODE")
		for _, name := range []string{"ci/デプロイ", "cafe\u0301", "\ufeffbom", "±°"} {
			tb.text(name)
			tb.text("token")
		}
		var got bytes.Buffer
		if err := tb.write(&got); err != nil {
			t.Fatal(err)
		}
		if got.String() != tc.want {
			t.Errorf("East Asian width %v: table\n%s\nwant\n%s", tc.wide, got.String(), tc.want)
		}
	}
}

// TestAgeMatchesDurationString: the allocation-free rendering of ages is
// time.Duration's own, rounded to seconds, for any duration.
func TestAgeMatchesDurationString(t *testing.T) {
	ds := []time.Duration{0, 1, 499 * time.Millisecond, 500 * time.Millisecond, time.Second, 59*time.Second + 600*time.Millisecond,
		time.Minute, time.Hour, time.Hour + time.Second, 25*time.Hour + 61*time.Second, 1000 * time.Hour,
		math.MaxInt64, math.MinInt64, math.MaxInt64 - 1, 1 << 62, 1<<62 - 1}
	for i := range 2000 {
		ds = append(ds, time.Duration(i)*1237*time.Millisecond, time.Duration(i)*time.Duration(i)*time.Duration(i)*time.Minute)
	}
	for _, d := range ds {
		for _, d := range []time.Duration{d, -d} {
			want := d.Round(time.Second).String()
			if d < 0 {
				want = "-" + d.Abs().Round(time.Second).String()
			}
			if got := age(d); got != want {
				t.Errorf("age(%d) = %q, want %q", int64(d), got, want)
			}
		}
	}
}

// TestTableNameQuotes: names with spaces or control characters, ASCII or
// not, are quoted; every other name, ASCII or not, is shown as it is.
func TestTableNameQuotes(t *testing.T) {
	for name, quoted := range map[string]bool{
		"feature-a": false, "team/x.lock": false, "ünïcödé": false, "日本": false, "~!@#": false,
		"a b": true, "tab\there": true, "esc\x1b[31m": true, "del\x7f": true, "nbsp\u00a0": true,
		"line\u2028sep": true, "c1\u0085": true,
	} {
		got := tableName(name)
		if want := map[bool]string{false: name, true: strconv.Quote(name)}[quoted]; got != want {
			t.Errorf("tableName(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestTableLimitsTheNameColumn: a name wider than the limit of its column (a 255-byte one in
// "ls") overflows its own row, two spaces before the next cell, and leaves the width of the
// column to the other names; a name at the limit still sets it.
func TestTableLimitsTheNameColumn(t *testing.T) {
	long := strings.Repeat("n", 255)
	atLimit := strings.Repeat("m", nameColumnWidth)
	cases := []struct {
		name string
		rows [][]string
		want string
	}{
		{"one long name", [][]string{{"a", "token"}, {long, "handle"}, {"ci/deploy", "token"}},
			"RESOURCE   MODE\n" +
				"a          token\n" +
				long + "  handle\n" +
				"ci/deploy  token\n"},
		{"a name at the limit", [][]string{{atLimit, "token"}, {long, "handle"}},
			"RESOURCE" + strings.Repeat(" ", nameColumnWidth-len("RESOURCE")+2) + "MODE\n" +
				atLimit + "  token\n" +
				long + "  handle\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := newTable(len(c.rows), "RESOURCE", "MODE").limit(0, nameColumnWidth)
			for _, r := range c.rows {
				tb.text(r[0])
				tb.text(r[1])
			}
			var got bytes.Buffer
			if err := tb.write(&got); err != nil {
				t.Fatal(err)
			}
			if got.String() != c.want {
				t.Errorf("table:\n%s\nwant:\n%s", got.String(), c.want)
			}
		})
	}
}

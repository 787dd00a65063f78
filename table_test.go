package main

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// TestTableMatchesTabwriter checks that the table of "ls" and "history"
// lays out exactly as text/tabwriter with padding 2 did, for cells of
// every width, multibyte runes included.
func TestTableMatchesTabwriter(t *testing.T) {
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

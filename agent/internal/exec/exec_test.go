package exec

import (
	"testing"

	"github.com/orchard-env/orchard/agent/internal/proc"
)

func TestCompleteUTF8(t *testing.T) {
	cases := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"abc", 3},
		{"aé", 3},
		{"a\xc3", 1},         // é cut after its first byte
		{"a\xe2\x82", 1},     // € cut after two bytes
		{"a\xf0\x9f\x98", 1}, // emoji cut after three bytes
		{"a\xf0\x9f\x98\x80", 5},
		{"\xc3", 1},      // nothing but a cut character: send it anyway
		{"a\xff", 2},     // invalid, not cut: send as is
		{"a\x80\x80", 3}, // stray continuation bytes
	}
	for _, c := range cases {
		if got := completeUTF8([]byte(c.in)); got != c.want {
			t.Errorf("completeUTF8(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestParseSignal(t *testing.T) {
	cases := []struct {
		in   string
		want string
		ok   bool
	}{
		{`"TERM"`, "TERM", true}, {`"SIGKILL"`, "KILL", true}, {`"int"`, "INT", true},
		{`9`, "KILL", true}, {`"15"`, "TERM", true}, {`null`, "TERM", true}, {``, "TERM", true},
		{`"NOPE"`, "", false}, {`0`, "", false}, {`99`, "", false}, {`true`, "", false},
	}
	for _, c := range cases {
		sig, err := parseSignal([]byte(c.in))
		if (err == nil) != c.ok || (c.ok && proc.SignalName(sig) != c.want) {
			t.Errorf("parseSignal(%s) = %v, %v", c.in, sig, err)
		}
	}
}

package exec

import (
	"encoding/base64"
	"strings"
	"unicode/utf8"
)

// encode renders bytes as JSON-safe text ("text": invalid UTF-8 replaced) or base64.
func encode(p []byte, b64 bool) string {
	if b64 {
		return base64.StdEncoding.EncodeToString(p)
	}
	return strings.ToValidUTF8(string(p), "\uFFFD")
}

func encodingName(b64 bool) string {
	if b64 {
		return "base64"
	}
	return "text"
}

// completeUTF8 returns how many leading bytes of p to send now in text mode:
// a multi-byte character cut at the end is held back for the next chunk
// rather than turned into replacement characters.
func completeUTF8(p []byte) int {
	for i := 1; i <= 3 && i <= len(p); i++ {
		c := p[len(p)-i]
		if c < utf8.RuneSelf {
			return len(p) // ASCII: nothing cut
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(p[len(p)-i:]) && len(p) > i {
				return len(p) - i
			}
			return len(p)
		}
	}
	return len(p)
}

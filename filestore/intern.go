package filestore

// interner shares the copies of repeated string values within one load.
// At most maxInterned distinct values are kept; later ones are copied as
// they come. Not safe for concurrent use: each loading goroutine has its
// own.
type interner map[string]string

// maxInterned bounds an [interner].
const maxInterned = 4096

// get returns a string equal to b, shared with earlier equal values.
func (in interner) get(b []byte) string {
	if s, ok := in[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(in) < maxInterned {
		in[s] = s
	}
	return s
}

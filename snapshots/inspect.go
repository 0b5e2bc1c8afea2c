package snapshots

import "io"

// Summary describes a verified snapshot file.
type Summary struct {
	Header    Header
	Version   uint32
	Sections  []SectionSummary // in file order, empty ones included
	Digest    [32]byte         // body digest, as Reader.Digest
	FileBytes int64
}

// SectionSummary counts one section's records and their bytes (record
// payloads only, without framing).
type SectionSummary struct {
	Name    string
	Records uint64
	Bytes   uint64
}

// Inspect reads a whole snapshot, verifies its trailer and that nothing
// follows it, and summarises it.
func Inspect(src io.Reader) (Summary, error) {
	r, err := NewReader(src)
	if err != nil {
		return Summary{}, err
	}
	s := Summary{Header: r.Header(), Version: Version}
	r.onSection = func(name string) {
		s.Sections = append(s.Sections, SectionSummary{Name: name})
	}
	for {
		_, data, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Summary{}, err
		}
		// A record always belongs to the last section begun.
		last := &s.Sections[len(s.Sections)-1]
		last.Records++
		last.Bytes += uint64(len(data))
	}
	if err := r.expectEnd(); err != nil {
		return Summary{}, err
	}
	s.Digest = r.Digest()
	s.FileBytes = r.off()
	return s, nil
}

package oplog

import (
	"bytes"
	"math"
	"strconv"
)

// Encode returns the entry's JSON. The same entry always encodes to the same
// bytes. Strings must be valid UTF-8 (see the package comment); Encode does
// not validate the entry otherwise.
func (e Entry) Encode() []byte {
	// Room for the field names and numbers, plus the strings with some
	// escaping (a PUT_END payload is JSON, so every quote in it doubles).
	n := 192 + len(e.Key) + len(e.Source) + len(e.Payload) + len(e.Payload)/4
	return e.AppendJSON(make([]byte, 0, n))
}

// AppendJSON appends the entry's JSON (as Encode) to dst.
func (e Entry) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"sequence_id":`...)
	dst = strconv.AppendUint(dst, e.SequenceID, 10)
	dst = append(dst, `,"timestamp":`...)
	dst = strconv.AppendInt(dst, e.TimestampMs, 10)
	dst = append(dst, `,"op_type":`...)
	dst = appendString(dst, e.OpType.String())
	dst = append(dst, `,"key":`...)
	dst = appendString(dst, e.Key)
	dst = append(dst, `,"payload":`...)
	dst = appendString(dst, e.Payload)
	dst = append(dst, `,"checksum":`...)
	dst = strconv.AppendUint(dst, uint64(e.Checksum), 10)
	dst = append(dst, `,"prefix_hash":`...)
	dst = strconv.AppendUint(dst, uint64(e.PrefixHash), 10)
	dst = append(dst, `,"key_sequence_id":`...)
	dst = strconv.AppendUint(dst, e.KeySequenceID, 10)
	dst = append(dst, `,"source":`...)
	dst = appendString(dst, string(e.Source))
	return append(dst, '}')
}

// MarshalJSON implements json.Marshaler with Encode.
func (e Entry) MarshalJSON() ([]byte, error) {
	return e.Encode(), nil
}

// UnmarshalJSON implements json.Unmarshaler with Decode. As the
// encoding/json convention asks, null leaves the entry unchanged.
func (e *Entry) UnmarshalJSON(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" {
		return nil
	}
	d, err := Decode(b)
	if err != nil {
		return err
	}
	*e = d
	return nil
}

// The entry's fields in JSON order; a field's index is its bit in the
// decoder's "seen" mask.
const (
	fSequenceID = iota
	fTimestamp
	fOpType
	fKey
	fPayload
	fChecksum
	fPrefixHash
	fKeySequenceID
	fSource
	numEntryFields
)

var entryFields = [numEntryFields]string{
	"sequence_id", "timestamp", "op_type", "key", "payload",
	"checksum", "prefix_hash", "key_sequence_id", "source",
}

// requiredEntryFields are all but "source", which the notes' entries
// (seed 004) do not have; a missing source decodes as SourceNone.
const requiredEntryFields = (1<<numEntryFields - 1) &^ (1 << fSource)

// Decode parses one entry strictly. It must be a JSON object with every
// field but "source" exactly once; fields it does not know are ignored so
// that a newer master can add some. Besides types and ranges it checks what
// the format promises: a known op_type, sequence_id and key_sequence_id
// >= 1, a non-empty key, a payload on PUT_END and only there, and a source
// only on REMOVE. Errors are errcode.InvalidParams. Decode does not check
// the checksum or the prefix hash (Verify does), so a follower can say
// which check failed.
func Decode(b []byte) (Entry, error) {
	d := decoder{b: b, what: "oplog entry"}
	if err := d.top(); err != nil {
		return Entry{}, err
	}
	var e Entry
	var seen uint16
	err := d.object(func(name []byte) error {
		f := entryField(name)
		if f < 0 {
			return d.skip(0)
		}
		if seen&(1<<f) != 0 {
			return d.fieldErr(entryFields[f], "appears twice")
		}
		seen |= 1 << f
		return d.entryValue(&e, f)
	})
	if err == nil {
		err = d.end()
	}
	if err == nil {
		err = d.checkEntry(&e, seen)
	}
	if err != nil {
		return Entry{}, d.result(err)
	}
	return e, nil
}

// checkEntry checks what a whole decoded entry must satisfy.
func (d *decoder) checkEntry(e *Entry, seen uint16) error {
	if missing := requiredEntryFields &^ seen; missing != 0 {
		for f := range entryFields {
			if missing&(1<<f) != 0 {
				return d.fieldErr(entryFields[f], "missing")
			}
		}
	}
	switch {
	case e.OpType == OpPutEnd && e.Payload == "":
		return d.fieldErr("payload", "empty on a PUT_END entry")
	case e.OpType != OpPutEnd && e.Payload != "":
		return d.fieldErr("payload", "must be empty on a %s entry", e.OpType)
	case e.OpType != OpRemove && e.Source != SourceNone:
		return d.fieldErr("source", "must be empty on a %s entry, got %q", e.OpType, e.Source)
	}
	return nil
}

func entryField(name []byte) int {
	switch string(name) {
	case "sequence_id":
		return fSequenceID
	case "timestamp":
		return fTimestamp
	case "op_type":
		return fOpType
	case "key":
		return fKey
	case "payload":
		return fPayload
	case "checksum":
		return fChecksum
	case "prefix_hash":
		return fPrefixHash
	case "key_sequence_id":
		return fKeySequenceID
	case "source":
		return fSource
	}
	return -1
}

// entryValue reads the value of field f into e.
func (d *decoder) entryValue(e *Entry, f int) error {
	name := entryFields[f]
	var err error
	switch f {
	case fSequenceID:
		if e.SequenceID, err = d.uintField(name, math.MaxUint64); err == nil && e.SequenceID == 0 {
			err = d.fieldErr(name, "must be >= 1")
		}
	case fTimestamp:
		e.TimestampMs, err = d.intField(name)
	case fOpType:
		if d.peek() != '"' {
			return d.typeErr(name, "a string")
		}
		var s []byte
		if s, err = d.str(); err == nil {
			var ok bool
			if e.OpType, ok = parseOpType(string(s)); !ok {
				err = d.fieldErr(name, "unknown value %q", s)
			}
		}
	case fKey:
		if e.Key, err = d.stringField(name); err == nil && e.Key == "" {
			err = d.fieldErr(name, "empty")
		}
	case fPayload:
		e.Payload, err = d.stringField(name)
	case fChecksum:
		var v uint64
		v, err = d.uintField(name, math.MaxUint32)
		e.Checksum = uint32(v)
	case fPrefixHash:
		var v uint64
		v, err = d.uintField(name, math.MaxUint32)
		e.PrefixHash = uint32(v)
	case fKeySequenceID:
		if e.KeySequenceID, err = d.uintField(name, math.MaxUint64); err == nil && e.KeySequenceID == 0 {
			err = d.fieldErr(name, "must be >= 1")
		}
	case fSource:
		var s string
		s, err = d.stringField(name)
		e.Source = Source(s)
	}
	return err
}

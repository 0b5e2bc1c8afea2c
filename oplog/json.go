package oplog

import (
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/moonraft/moonraft/errcode"
)

// The JSON reading and writing shared by the entry and the PUT_END payload.
// Writing mirrors encoding/json's escaping exactly (HTML-safe, U+2028/2029
// escaped) so any tool that re-marshals an entry gets the same bytes.
// Reading is strict where encoding/json is lenient: field names match
// exactly, duplicates are errors, strings must be valid UTF-8 with no lone
// surrogates, and integers must fit their field.

const hexDigits = "0123456789abcdef"

// plain[c] is true for the ASCII bytes written into a JSON string as they are.
var plain = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendString appends s as a JSON string. Invalid UTF-8 becomes \ufffd, as
// in encoding/json; see the package comment for why that never reaches etcd.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if plain[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// maxDepth bounds the nesting of unknown values Decode skips, so hostile
// input cannot exhaust the stack.
const maxDepth = 1000

// decoder reads one JSON document from b, which it never modifies.
type decoder struct {
	b       []byte
	i       int
	what    string // names the document in errors: "oplog entry", "put_end payload"
	scratch []byte // unescaped string contents, reused
}

func (d *decoder) syntaxErr(msg string) error {
	if d.i >= len(d.b) {
		return errcode.New(errcode.InvalidParams, "%s: invalid JSON: unexpected end of input", d.what)
	}
	return errcode.New(errcode.InvalidParams, "%s: invalid JSON at offset %d: %s", d.what, d.i, msg)
}

// truncated reports input that ends inside a value.
func (d *decoder) truncated() error {
	d.i = len(d.b)
	return d.syntaxErr("")
}

// fieldError is a bad value found while decoding. Its field is a path
// relative to the object being read; each enclosing level prefixes its own
// part (within), and result turns it into an errcode.Error at the top. So
// paths are only built when something is wrong.
type fieldError struct {
	field, msg string
}

func (e *fieldError) Error() string { return "field " + strconv.Quote(e.field) + ": " + e.msg }

func (d *decoder) fieldErr(field, format string, args ...any) error {
	return &fieldError{field: field, msg: fmt.Sprintf(format, args...)}
}

// within prefixes the path of a fieldError with the path of its container.
func within(err error, path string) error {
	if fe, ok := err.(*fieldError); ok {
		switch {
		case fe.field == "":
			fe.field = path
		case fe.field[0] == '[':
			fe.field = path + fe.field
		default:
			fe.field = path + "." + fe.field
		}
	}
	return err
}

// top checks that the document is an object.
func (d *decoder) top() error {
	if d.peek() == '{' {
		return nil
	}
	if k := kind(d.peek()); k != "" {
		return errcode.New(errcode.InvalidParams, "%s: expected a JSON object, got %s", d.what, k)
	}
	return d.syntaxErr("expected a JSON object")
}

// result turns a decoding error into the errcode.Error the API returns.
func (d *decoder) result(err error) error {
	if fe, ok := err.(*fieldError); ok {
		return errcode.New(errcode.InvalidParams, "%s: field %q: %s", d.what, fe.field, fe.msg)
	}
	return err
}

func (d *decoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end of input.
func (d *decoder) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// end checks that nothing but white space follows the document.
func (d *decoder) end() error {
	if d.ws(); d.i < len(d.b) {
		return d.syntaxErr("data after the top-level value")
	}
	return nil
}

// typeErr reports that the value for field is not of the wanted type.
// object and array have checked that a value starts here.
func (d *decoder) typeErr(field, want string) error {
	return d.fieldErr(field, "expected %s, got %s", want, kind(d.peek()))
}

// kind names the JSON type of the value starting with c, or "" if no value
// starts with c.
func kind(c byte) string {
	switch {
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	case c == '-' || (c >= '0' && c <= '9'):
		return "a number"
	}
	return ""
}

// object reads an object, calling member for each field with d positioned at
// its value; member must consume the value. name may alias d.scratch, so it
// is only valid until member reads another string.
func (d *decoder) object(member func(name []byte) error) error {
	d.i++ // '{'
	if d.peek() == '}' {
		d.i++
		return nil
	}
	for {
		if d.peek() != '"' {
			return d.syntaxErr("expected a field name")
		}
		name, err := d.str()
		if err != nil {
			return err
		}
		if d.peek() != ':' {
			return d.syntaxErr("expected ':'")
		}
		d.i++
		if kind(d.peek()) == "" {
			return d.syntaxErr("expected a value")
		}
		if err := member(name); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return d.syntaxErr("expected ',' or '}'")
		}
	}
}

// array reads an array, calling elem with d positioned at each element.
func (d *decoder) array(elem func(i int) error) error {
	d.i++ // '['
	if d.peek() == ']' {
		d.i++
		return nil
	}
	for n := 0; ; n++ {
		if kind(d.peek()) == "" {
			return d.syntaxErr("expected a value")
		}
		if err := elem(n); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return nil
		default:
			return d.syntaxErr("expected ',' or ']'")
		}
	}
}

// str reads a string (d.b[d.i] == '"') and returns its unescaped bytes. The
// result aliases d.b when there are no escapes, d.scratch otherwise.
func (d *decoder) str() ([]byte, error) {
	d.i++ // opening quote
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return d.b[start : d.i-1], nil
		case c == '\\':
			if d.scratch == nil {
				// Unescaping only shrinks, so the rest of the input is room
				// enough for this and every later string: one allocation.
				d.scratch = make([]byte, 0, len(d.b)-start)
			}
			d.scratch = append(d.scratch[:0], d.b[start:d.i]...)
			return d.strEscaped()
		case c < 0x20:
			return nil, d.syntaxErr("control character in string")
		case c < utf8.RuneSelf:
			d.i++
		default:
			if err := d.rune(); err != nil {
				return nil, err
			}
		}
	}
	return nil, d.truncated()
}

// rune steps over one multi-byte UTF-8 sequence, rejecting invalid ones.
func (d *decoder) rune() error {
	r, size := utf8.DecodeRune(d.b[d.i:])
	if r == utf8.RuneError && size == 1 {
		return d.syntaxErr("invalid UTF-8 in string")
	}
	d.i += size
	return nil
}

// strEscaped finishes str once an escape was seen, unescaping into scratch.
func (d *decoder) strEscaped() ([]byte, error) {
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return d.scratch, nil
		case c == '\\':
			if err := d.escape(); err != nil {
				return nil, err
			}
		case c < 0x20:
			return nil, d.syntaxErr("control character in string")
		case c < utf8.RuneSelf:
			d.scratch = append(d.scratch, c)
			d.i++
		default:
			start := d.i
			if err := d.rune(); err != nil {
				return nil, err
			}
			d.scratch = append(d.scratch, d.b[start:d.i]...)
		}
	}
	return nil, d.truncated()
}

// escape decodes one backslash escape into scratch.
func (d *decoder) escape() error {
	if d.i+1 >= len(d.b) {
		return d.truncated()
	}
	c := d.b[d.i+1]
	d.i += 2
	switch c {
	case '"', '\\', '/':
		d.scratch = append(d.scratch, c)
	case 'b':
		d.scratch = append(d.scratch, '\b')
	case 'f':
		d.scratch = append(d.scratch, '\f')
	case 'n':
		d.scratch = append(d.scratch, '\n')
	case 'r':
		d.scratch = append(d.scratch, '\r')
	case 't':
		d.scratch = append(d.scratch, '\t')
	case 'u':
		r, err := d.hex4()
		if err != nil {
			return err
		}
		if utf8.ValidRune(r) {
			d.scratch = utf8.AppendRune(d.scratch, r)
			return nil
		}
		// A surrogate: valid only as a high one followed by \u and a low one.
		// A lone surrogate has no UTF-8 form, so it could not round-trip.
		if r >= 0xDC00 || d.i+1 >= len(d.b) || d.b[d.i] != '\\' || d.b[d.i+1] != 'u' {
			return d.syntaxErr("lone UTF-16 surrogate in string")
		}
		d.i += 2
		lo, err := d.hex4()
		if err != nil {
			return err
		}
		if lo < 0xDC00 || lo > 0xDFFF {
			return d.syntaxErr("lone UTF-16 surrogate in string")
		}
		d.scratch = utf8.AppendRune(d.scratch, 0x10000+(r-0xD800)<<10+(lo-0xDC00))
	default:
		d.i -= 2
		return d.syntaxErr("invalid escape in string")
	}
	return nil
}

func (d *decoder) hex4() (rune, error) {
	if d.i+4 > len(d.b) {
		return 0, d.truncated()
	}
	var r rune
	for _, c := range d.b[d.i : d.i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, d.syntaxErr("invalid \\u escape in string")
		}
		r = r<<4 | rune(c)
	}
	d.i += 4
	return r, nil
}

// number scans a JSON number and reports its sign, its integer digits and
// whether it had a fraction or an exponent.
func (d *decoder) number() (neg bool, digits []byte, integer bool, err error) {
	if d.b[d.i] == '-' {
		neg = true
		d.i++
	}
	start := d.i
	switch {
	case d.i < len(d.b) && d.b[d.i] == '0':
		d.i++
	case d.i < len(d.b) && d.b[d.i] >= '1' && d.b[d.i] <= '9':
		d.skipDigits()
	default:
		return false, nil, false, d.syntaxErr("invalid number")
	}
	digits = d.b[start:d.i]
	integer = true
	if d.i < len(d.b) && d.b[d.i] == '.' {
		d.i++
		if d.skipDigits() == 0 {
			return false, nil, false, d.syntaxErr("invalid number")
		}
		integer = false
	}
	if d.i < len(d.b) && (d.b[d.i] == 'e' || d.b[d.i] == 'E') {
		d.i++
		if d.i < len(d.b) && (d.b[d.i] == '+' || d.b[d.i] == '-') {
			d.i++
		}
		if d.skipDigits() == 0 {
			return false, nil, false, d.syntaxErr("invalid number")
		}
		integer = false
	}
	return neg, digits, integer, nil
}

func (d *decoder) skipDigits() int {
	start := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	return d.i - start
}

// magnitude converts decimal digits to a uint64, reporting overflow of max.
func magnitude(digits []byte, max uint64) (uint64, bool) {
	var v uint64
	for _, c := range digits {
		n := uint64(c - '0')
		if v > (max-n)/10 {
			return 0, false
		}
		v = v*10 + n
	}
	return v, true
}

// uintField reads an unsigned integer value in [0, max] for field.
func (d *decoder) uintField(field string, max uint64) (uint64, error) {
	if kind(d.peek()) != "a number" {
		return 0, d.typeErr(field, "an unsigned integer")
	}
	start := d.i
	neg, digits, integer, err := d.number()
	if err != nil {
		return 0, err
	}
	if !integer {
		return 0, d.fieldErr(field, "expected an unsigned integer, got %s", d.b[start:d.i])
	}
	if neg {
		return 0, d.fieldErr(field, "must not be negative")
	}
	v, ok := magnitude(digits, max)
	if !ok {
		return 0, d.fieldErr(field, "%s is out of range (max %d)", digits, max)
	}
	return v, nil
}

// intField reads a signed 64-bit integer value for field.
func (d *decoder) intField(field string) (int64, error) {
	if kind(d.peek()) != "a number" {
		return 0, d.typeErr(field, "an integer")
	}
	start := d.i
	neg, digits, integer, err := d.number()
	if err != nil {
		return 0, err
	}
	if !integer {
		return 0, d.fieldErr(field, "expected an integer, got %s", d.b[start:d.i])
	}
	if neg {
		v, ok := magnitude(digits, 1<<63)
		if !ok {
			return 0, d.fieldErr(field, "-%s is out of range", digits)
		}
		return int64(-v), nil // -(1<<63) wraps to math.MinInt64, as wanted
	}
	v, ok := magnitude(digits, 1<<63-1)
	if !ok {
		return 0, d.fieldErr(field, "%s is out of range", digits)
	}
	return int64(v), nil
}

// stringField reads a string value for field.
func (d *decoder) stringField(field string) (string, error) {
	if d.peek() != '"' {
		return "", d.typeErr(field, "a string")
	}
	s, err := d.str()
	return string(s), err
}

// skip steps over one value of any type, checking its syntax.
func (d *decoder) skip(depth int) error {
	if depth > maxDepth {
		return d.syntaxErr("nesting too deep")
	}
	switch c := d.peek(); {
	case c == '{':
		return d.object(func([]byte) error { return d.skip(depth + 1) })
	case c == '[':
		return d.array(func(int) error { return d.skip(depth + 1) })
	case c == '"':
		_, err := d.str()
		return err
	case c == 't':
		return d.literal("true")
	case c == 'f':
		return d.literal("false")
	case c == 'n':
		return d.literal("null")
	default: // a number: object and array have checked that a value starts here
		_, _, _, err := d.number()
		return err
	}
}

func (d *decoder) literal(lit string) error {
	if len(d.b)-d.i < len(lit) || string(d.b[d.i:d.i+len(lit)]) != lit {
		return d.syntaxErr("invalid literal")
	}
	d.i += len(lit)
	return nil
}

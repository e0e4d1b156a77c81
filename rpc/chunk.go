package rpc

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

const (
	// chunkPayloadMax is omp's chunk payload size (256 KiB of decoded bytes).
	chunkPayloadMax = 256 << 10
	// defaultFrameMax / defaultReassembledMax are omp 18.2.3's limits, used
	// until a ready frame announces others.
	defaultFrameMax       = 1 << 20
	defaultReassembledMax = 64 << 20
	maxChunkIDLen         = 128
)

// chunkFrame is one omp protocol v2 rpc_chunk frame.
type chunkFrame struct {
	ChunkID    *string `json:"chunkId"`
	Index      *int64  `json:"index"`
	Count      *int64  `json:"count"`
	ByteLength *int64  `json:"byteLength"`
	Data       *string `json:"data"`
}

// reassembler rebuilds one logical frame from consecutive rpc_chunk frames,
// strictly: index order, a constant id, count and length, canonical base64,
// the declared byte length exactly, valid UTF-8 and one JSON object. Any
// deviation is an error and drops the sequence. Not safe for concurrent use.
type reassembler struct {
	frameMax, reassembledMax int64

	id         string
	count      int64
	byteLength int64
	next       int64
	buf        []byte
	active     bool
}

func newReassembler() *reassembler {
	return &reassembler{frameMax: defaultFrameMax, reassembledMax: defaultReassembledMax}
}

// pending reports whether a chunk sequence is under way; any other frame
// arriving now interrupts it.
func (r *reassembler) pending() bool { return r.active }

// reset drops a sequence in progress.
func (r *reassembler) reset() {
	r.active = false
	r.buf = nil
	r.id = ""
	r.next = 0
}

// push adds one rpc_chunk frame (the whole JSON line). It returns the
// reassembled frame when the sequence completes, nil while it continues.
func (r *reassembler) push(line []byte) ([]byte, error) {
	out, err := r.pushChunk(line)
	if err != nil {
		r.reset()
	}
	return out, err
}

// parseChunk decodes a chunk frame as encoding/json would, and returns its
// data's contents undecoded (base64 to be checked). Every chunk omp writes
// has its data as a string without escapes: that one is found by a scan
// and left out of what encoding/json decodes, so the payload, nearly all
// of the line, is not run through its validator, decoder and unquoting.
// Anything else goes through encoding/json whole.
func parseChunk(line []byte) (chunkFrame, []byte, error) {
	var c chunkFrame
	if vs, ve, ok := chunkDataSpan(line); ok {
		meta := make([]byte, 0, len(line)-(ve-vs))
		meta = append(append(meta, line[:vs]...), line[ve:]...)
		if err := json.Unmarshal(meta, &c); err != nil {
			return c, nil, fmt.Errorf("invalid rpc_chunk frame: %w", err)
		}
		return c, line[vs:ve], nil
	}
	if err := json.Unmarshal(line, &c); err != nil {
		return c, nil, fmt.Errorf("invalid rpc_chunk frame: %w", err)
	}
	if c.Data == nil {
		return c, nil, nil
	}
	return c, []byte(*c.Data), nil
}

// chunkDataSpan returns the bounds of the contents of line's last
// top-level "data" member (the one encoding/json keeps) when line is one
// valid JSON object and that member is a string without escapes. Its
// contents are then the string's value, and they hold no control bytes.
func chunkDataSpan(line []byte) (vs, ve int, ok bool) {
	i := ws(line, 0)
	if i >= len(line) || line[i] != '{' {
		return 0, 0, false
	}
	if i = ws(line, i+1); i < len(line) && line[i] == '}' {
		return 0, 0, false
	}
	for {
		ks, ke, next, kesc, err := scanStr(line, ws(line, i))
		if err != nil {
			return 0, 0, false
		}
		if i = ws(line, next); i >= len(line) || line[i] != ':' {
			return 0, 0, false
		}
		i = ws(line, i+1)
		isData := keyIs(line[ks:ke], kesc, "data")
		if i < len(line) && line[i] == '"' {
			s, e, next, esc, err := scanStr(line, i)
			if err != nil {
				return 0, 0, false
			}
			if isData {
				vs, ve, ok = s, e, !esc
			}
			i = next
		} else {
			next, err := scanValue(line, i, 1)
			if err != nil {
				return 0, 0, false
			}
			if isData {
				ok = false
			}
			i = next
		}
		if i = ws(line, i); i >= len(line) {
			return 0, 0, false
		}
		switch line[i] {
		case ',':
			i++
		case '}':
			if ws(line, i+1) != len(line) {
				return 0, 0, false
			}
			return vs, ve, ok
		default:
			return 0, 0, false
		}
	}
}

func (r *reassembler) pushChunk(line []byte) ([]byte, error) {
	c, raw, err := parseChunk(line)
	if err != nil {
		return nil, err
	}
	if c.ChunkID == nil || c.Index == nil || c.Count == nil || c.ByteLength == nil || c.Data == nil {
		return nil, errors.New("rpc_chunk frame lacks a required field")
	}
	id, index, count, byteLength := *c.ChunkID, *c.Index, *c.Count, *c.ByteLength
	maxCount := (r.reassembledMax + chunkPayloadMax - 1) / chunkPayloadMax
	switch {
	case id == "" || len(id) > maxChunkIDLen:
		return nil, errors.New("invalid rpc_chunk id")
	case count < 2 || count > maxCount:
		return nil, fmt.Errorf("invalid rpc_chunk count %d", count)
	case index < 0 || index >= count:
		return nil, fmt.Errorf("invalid rpc_chunk index %d of %d", index, count)
	case byteLength < r.frameMax || byteLength > r.reassembledMax:
		return nil, fmt.Errorf("invalid rpc_chunk byteLength %d", byteLength)
	}
	data, err := decodeCanonicalBase64(raw)
	if err != nil {
		return nil, err
	}
	if len(data) > chunkPayloadMax {
		return nil, fmt.Errorf("rpc_chunk payload of %d bytes exceeds %d", len(data), chunkPayloadMax)
	}
	if !r.active {
		if index != 0 {
			return nil, fmt.Errorf("rpc_chunk sequence starts at index %d, not 0", index)
		}
		r.active = true
		r.id, r.count, r.byteLength, r.next = id, count, byteLength, 0
		// No allocation of the declared length: a chunk costs what it
		// carries, whatever it announces.
		r.buf = nil
	}
	if id != r.id || count != r.count || byteLength != r.byteLength || index != r.next {
		return nil, errors.New("rpc_chunk sequence mismatch (id, count, length or order)")
	}
	if int64(len(r.buf))+int64(len(data)) > r.byteLength {
		return nil, errors.New("rpc_chunk sequence exceeds its declared byteLength")
	}
	if need := len(r.buf) + len(data); need > cap(r.buf) {
		// Double as data arrives, never past the declared length.
		nb := make([]byte, len(r.buf), min(max(2*cap(r.buf), need), int(r.byteLength)))
		copy(nb, r.buf)
		r.buf = nb
	}
	r.buf = append(r.buf, data...)
	r.next++
	if r.next < r.count {
		return nil, nil
	}
	out := r.buf
	r.reset()
	if int64(len(out)) != byteLength {
		return nil, fmt.Errorf("rpc_chunk sequence holds %d bytes, declared %d", len(out), byteLength)
	}
	if !utf8.Valid(out) {
		return nil, errors.New("reassembled rpc frame is not valid UTF-8")
	}
	return out, nil
}

// decodeCanonicalBase64 accepts only the one canonical standard encoding of
// some bytes: alphabet characters, correct padding, zero pad bits, no
// whitespace.
func decodeCanonicalBase64(s []byte) ([]byte, error) {
	if len(s) == 0 || len(s)%4 != 0 {
		return nil, errors.New("rpc_chunk data is not canonical base64")
	}
	// The strict decoder rejects every other byte outside the alphabet,
	// and padding anywhere but at the end; it skips only CR and LF.
	if bytes.IndexByte(s, '\r') >= 0 || bytes.IndexByte(s, '\n') >= 0 {
		return nil, errors.New("rpc_chunk data is not canonical base64")
	}
	b := make([]byte, base64.StdEncoding.DecodedLen(len(s)))
	n, err := base64.StdEncoding.Strict().Decode(b, s)
	if err != nil {
		return nil, errors.New("rpc_chunk data is not canonical base64")
	}
	return b[:n], nil
}

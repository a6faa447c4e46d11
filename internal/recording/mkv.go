package recording

import (
	"encoding/binary"
	"io"
)

// The encoder's input is Matroska with one PNG video track: the smallest
// container ffmpeg reads from a pipe that carries a timestamp on every
// frame. With it the daemon sends a frame only when the screen changed,
// and ffmpeg still places each one at the moment it was captured; a still
// screen costs ffmpeg nothing. Only the few elements ffmpeg needs are
// written (EBML header, an open-ended Segment, Info, Tracks, one Cluster
// per frame), every size as an 8-byte vint so no size has to be known
// before its element is built.

// Matroska element IDs (their bytes include the vint marker).
var (
	idEBML               = []byte{0x1A, 0x45, 0xDF, 0xA3}
	idEBMLVersion        = []byte{0x42, 0x86}
	idEBMLReadVersion    = []byte{0x42, 0xF7}
	idEBMLMaxIDLength    = []byte{0x42, 0xF2}
	idEBMLMaxSizeLength  = []byte{0x42, 0xF3}
	idDocType            = []byte{0x42, 0x82}
	idDocTypeVersion     = []byte{0x42, 0x87}
	idDocTypeReadVersion = []byte{0x42, 0x85}
	idSegment            = []byte{0x18, 0x53, 0x80, 0x67}
	idInfo               = []byte{0x15, 0x49, 0xA9, 0x66}
	idTimecodeScale      = []byte{0x2A, 0xD7, 0xB1}
	idMuxingApp          = []byte{0x4D, 0x80}
	idWritingApp         = []byte{0x57, 0x41}
	idTracks             = []byte{0x16, 0x54, 0xAE, 0x6B}
	idTrackEntry         = []byte{0xAE}
	idTrackNumber        = []byte{0xD7}
	idTrackUID           = []byte{0x73, 0xC5}
	idTrackType          = []byte{0x83}
	idCodecID            = []byte{0x86}
	idCodecPrivate       = []byte{0x63, 0xA2}
	idVideo              = []byte{0xE0}
	idPixelWidth         = []byte{0xB0}
	idPixelHeight        = []byte{0xBA}
	idCluster            = []byte{0x1F, 0x43, 0xB6, 0x75}
	idTimecode           = []byte{0xE7}
	idSimpleBlock        = []byte{0xA3}
	idBlockGroup         = []byte{0xA0}
	idBlock              = []byte{0xA1}
	idBlockDuration      = []byte{0x9B}
)

// unknownSize is the 8-byte vint that marks an element of unknown size:
// the Segment, which ends when the stream does.
var unknownSize = []byte{0x01, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}

// element returns id, n's 8-byte size vint and the data.
func element(id []byte, data ...[]byte) []byte {
	n := 0
	for _, d := range data {
		n += len(d)
	}
	out := make([]byte, 0, len(id)+8+n)
	out = append(out, id...)
	var size [8]byte
	binary.BigEndian.PutUint64(size[:], uint64(n))
	size[0] = 0x01 // the 8-byte vint marker; sizes stay below 2^56
	out = append(out, size[:]...)
	for _, d := range data {
		out = append(out, d...)
	}
	return out
}

// uintElement is an unsigned integer element in the fewest bytes.
func uintElement(id []byte, v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	i := 0
	for i < 7 && b[i] == 0 {
		i++
	}
	return element(id, b[i:])
}

// mkvHeader is everything before the first frame of a stream of width ×
// height PNG frames with millisecond timestamps.
func mkvHeader(width, height int) []byte {
	// PNG in Matroska travels as a VfW codec: a BITMAPINFOHEADER naming
	// the FourCC "MPNG", as ffmpeg itself writes it.
	bih := make([]byte, 40)
	binary.LittleEndian.PutUint32(bih[0:], 40)
	binary.LittleEndian.PutUint32(bih[4:], uint32(width))
	binary.LittleEndian.PutUint32(bih[8:], uint32(height))
	binary.LittleEndian.PutUint16(bih[12:], 1)  // planes
	binary.LittleEndian.PutUint16(bih[14:], 24) // bits per pixel
	copy(bih[16:], "MPNG")
	var out []byte
	out = append(out, element(idEBML,
		uintElement(idEBMLVersion, 1),
		uintElement(idEBMLReadVersion, 1),
		uintElement(idEBMLMaxIDLength, 4),
		uintElement(idEBMLMaxSizeLength, 8),
		element(idDocType, []byte("matroska")),
		uintElement(idDocTypeVersion, 4),
		uintElement(idDocTypeReadVersion, 2),
	)...)
	out = append(out, idSegment...)
	out = append(out, unknownSize...)
	out = append(out, element(idInfo,
		uintElement(idTimecodeScale, 1_000_000), // timestamps in ms
		element(idMuxingApp, []byte("cubicle")),
		element(idWritingApp, []byte("cubicle")),
	)...)
	out = append(out, element(idTracks,
		element(idTrackEntry,
			uintElement(idTrackNumber, 1),
			uintElement(idTrackUID, 1),
			uintElement(idTrackType, 1), // video
			element(idCodecID, []byte("V_MS/VFW/FOURCC")),
			element(idCodecPrivate, bih),
			element(idVideo,
				uintElement(idPixelWidth, uint64(width)),
				uintElement(idPixelHeight, uint64(height)),
			),
		),
	)...)
	return out
}

// writeFrame writes one PNG frame at ms milliseconds as a cluster of its
// own (a cluster's blocks are timed relative to it in 16 bits; one block
// per cluster never runs out of that range). A frame's duration is
// normally left out: it lasts until the next one. The last frame has one
// (dur, in ms), or ffmpeg would guess it and the file would run longer
// than the recording did.
func writeFrame(w io.Writer, ms uint64, png []byte, dur uint64) error {
	var b []byte
	if dur == 0 {
		// SimpleBlock: track 1 as a vint, relative time 0, flags: keyframe.
		b = element(idSimpleBlock, []byte{0x81, 0x00, 0x00, 0x80}, png)
	} else {
		// A Block has no keyframe flag; a BlockGroup without references is one.
		b = element(idBlockGroup,
			element(idBlock, []byte{0x81, 0x00, 0x00, 0x00}, png),
			uintElement(idBlockDuration, dur),
		)
	}
	_, err := w.Write(element(idCluster, uintElement(idTimecode, ms), b))
	return err
}

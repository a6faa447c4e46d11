// Package proto holds the .proto contracts of the agent protocol; the generated
// Go code lives in the subpackages and is committed (regenerate with go generate).
package proto

//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --connect-go_out=. --connect-go_opt=paths=source_relative process/process.proto filesystem/filesystem.proto desktop/desktop.proto

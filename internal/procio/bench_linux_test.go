//go:build linux

package procio

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// floodFrame is one frame of the flood benchmarks: about 1 KB, the size of
// the message_update frames omp streams.
var floodFrame = append(bytes.Repeat([]byte("x"), 1023), '\n')

const floodFrames = 100 << 10 // 100 MiB

func init() {
	// flood writes floodFrames frames to stdout, PROCIO_FLOOD_CHUNK frames
	// a write (1: a write a frame, as a program writing each frame as it
	// makes it, blocking until it is taken).
	helpers["flood"] = func() {
		chunk, _ := strconv.Atoi(os.Getenv("PROCIO_FLOOD_CHUNK"))
		buf := bytes.Repeat(floodFrame, max(chunk, 1))
		for n := 0; n < floodFrames; n += max(chunk, 1) {
			if _, err := os.Stdout.Write(buf); err != nil {
				os.Exit(1)
			}
		}
	}
}

// BenchmarkStdout reads a command's flood of 100 MiB through its stdout
// channel (in 128 KiB reads, as rpc's reader does during a flood), from a
// socket (Start) and, for comparison, a pipe of the default size and one
// raised to 128 KiB (as rpc raises its pipe during a flood); frames written
// one a write and 1024 a write. It reports the CPU time of the host and of
// the command per run, and the host's reads.
func BenchmarkStdout(b *testing.B) {
	for _, chunk := range []int{1, 1024} {
		for _, kind := range []string{"socket", "pipe", "pipe128k"} {
			b.Run(kind+"/frames-a-write="+strconv.Itoa(chunk), func(b *testing.B) {
				b.SetBytes(int64(floodFrames * len(floodFrame)))
				buf := make([]byte, 128<<10)
				var childCPU time.Duration
				reads := 0
				u0, s0 := selfCPU()
				for b.Loop() {
					cmd := helper("flood")
					cmd.Env = append(cmd.Env, "PROCIO_FLOOD_CHUNK="+strconv.Itoa(chunk))
					out, done := startFlood(b, cmd, kind)
					var n int64
					for {
						m, err := out.Read(buf)
						n += int64(m)
						reads++
						if errors.Is(err, io.EOF) {
							break
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					childCPU += done()
					if n != int64(floodFrames*len(floodFrame)) {
						b.Fatalf("read %d bytes", n)
					}
				}
				u1, s1 := selfCPU()
				b.ReportMetric(float64((u1-u0+s1-s0).Nanoseconds())/float64(b.N), "host-cpu-ns/op")
				b.ReportMetric(float64(childCPU.Nanoseconds())/float64(b.N), "child-cpu-ns/op")
				b.ReportMetric(float64(reads)/float64(b.N), "reads/op")
			})
		}
	}
}

// startFlood starts cmd with its stdout on a channel of kind and returns
// the host's end and what ends the command.
func startFlood(b *testing.B, cmd *exec.Cmd, kind string) (io.Reader, func() time.Duration) {
	if kind == "socket" {
		p, err := Start(cmd)
		if err != nil {
			b.Fatal(err)
		}
		return p.Stdout, func() time.Duration {
			p.Close()
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
			return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	if kind == "pipe128k" {
		rc, _ := r.SyscallConn()
		var errno syscall.Errno
		_ = rc.Control(func(fd uintptr) {
			_, _, errno = syscall.Syscall(syscall.SYS_FCNTL, fd, 1031 /* F_SETPIPE_SZ */, 128<<10)
		})
		if errno != 0 {
			b.Fatal(errno)
		}
	}
	cmd.Stdout = w
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	w.Close()
	return r, func() time.Duration {
		r.Close()
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
		return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
}

// selfCPU is this process's user and system CPU time.
func selfCPU() (user, sys time.Duration) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

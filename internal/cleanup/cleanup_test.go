package cleanup

import (
	"slices"
	"testing"
)

func TestStack(t *testing.T) {
	tests := []struct {
		name    string
		release bool
		want    []int
	}{
		{"failure undoes in reverse", false, []int{3, 2, 1}},
		{"success keeps everything", true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []int
			var s Stack
			for i := 1; i <= 3; i++ {
				s.Add(func() { got = append(got, i) })
			}
			if tt.release {
				s.Release()
			}
			s.Run()
			s.Run() // a second Run does nothing
			if !slices.Equal(got, tt.want) {
				t.Errorf("ran %v, want %v", got, tt.want)
			}
		})
	}
}

package forge

import (
	"strconv"
	"strings"
)

// Brief is err's message with what any forge answered cut down to its
// status: for whoever chose the forge's URL and reads what Runway says
// of it (a Kubernetes object's status and events), who must not read
// through Runway what the address the URL names answers. The operator's
// log keeps the whole error.
func Brief(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	for _, ae := range apiErrors(err, nil) {
		msg = strings.ReplaceAll(msg, ae.Error(), ae.Method+" "+ae.URL+": HTTP "+strconv.Itoa(ae.Status))
		if len(ae.Message) >= 4 {
			// Quoted elsewhere in the chain, in a caller's own words.
			msg = strings.ReplaceAll(msg, ae.Message, "…")
		}
	}
	return msg
}

// apiErrors appends every APIError in err's tree to out.
func apiErrors(err error, out []*APIError) []*APIError {
	if ae, ok := err.(*APIError); ok {
		return append(out, ae)
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			out = apiErrors(e, out)
		}
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			out = apiErrors(e, out)
		}
	}
	return out
}

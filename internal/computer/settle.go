package computer

import "github.com/cubicle-dev/cubicle/internal/action"

// applySettle makes a screenshot wait, as the options ask, until the
// screen has had no change for SettleMS (at most SettleMaxMS): the agent
// watches X damage, so an observing screenshot comes once the page has
// painted rather than after a fixed sleep.
func applySettle(a *action.Action, o ImageOptions) {
	a.SettleMS, a.SettleMaxMS = o.SettleMS, o.SettleMaxMS
}

// A banner a screenshot can find (solid magenta, 60 px, full width) and a
// title a window list can find.
const banner = document.createElement('div')
banner.id = 'cubicle-e2e-banner'
banner.style.cssText = 'position:fixed;top:0;left:0;right:0;height:60px;background:#ff00ff;z-index:2147483647'
document.documentElement.appendChild(banner)
document.title = 'EXT: ' + document.title

"""The page's inline CSS and JS: one self-contained file that works opened from disk, offline."""

from __future__ import annotations

CSS = """
:root{color-scheme:light;--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#fff;--soft:#f6f8fa;
--pass:#1a7f37;--pass-bg:#e6f4ea;--fail:#cf222e;--fail-bg:#fdecec;--fail-bg2:#f8d3d3;
--part:#9a6700;--part-bg:#fff4d4;--err:#57606a;--err-bg:#eceff2;--err-bg2:#f7f8fa;
--mono:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace}
*{box-sizing:border-box}
body{margin:0;font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
color:var(--fg);background:var(--bg)}
a{color:#0969da;text-decoration:none}a:hover{text-decoration:underline}
code,pre,kbd{font-family:var(--mono);font-size:12px}
header.top{display:flex;align-items:center;gap:16px;padding:8px 24px;background:#24292f;color:#fff}
header.top .brand{font-weight:600;letter-spacing:.2px}
header.top .brand span{font-weight:400;color:#c9d1d9;margin-left:6px}
header.top nav{margin-left:auto;display:flex;gap:14px}
header.top nav a{color:#c9d1d9}header.top nav a:hover{color:#fff}
main{padding:14px 24px 32px}
h1{font-size:18px;margin:0 0 6px;font-weight:600}
h1 code{font-size:16px}
h2{font-size:15px;margin:22px 0 8px;font-weight:600}
.facts{display:flex;flex-wrap:wrap;gap:4px 20px;margin:0 0 10px;color:var(--muted)}
.facts div{display:flex;gap:6px}.facts dt{font-weight:600}.facts dd{margin:0;color:var(--fg)}
.bar{display:flex;flex-wrap:wrap;align-items:center;gap:8px 18px;margin:8px 0}
.counts{display:flex;flex-wrap:wrap;gap:6px;margin:0;padding:0;list-style:none}
.chip{display:inline-flex;gap:5px;align-items:center;border:1px solid var(--line);border-left-width:3px;
border-radius:4px;padding:1px 8px;background:var(--soft);white-space:nowrap}
.chip b{font-variant-numeric:tabular-nums}
.chip.s-pass{border-left-color:var(--pass);background:var(--pass-bg)}
.chip.s-fail{border-left-color:var(--fail);background:var(--fail-bg)}
.chip.s-partial{border-left-color:var(--part);background:var(--part-bg)}
.chip.s-error{border-left-color:var(--err);background:repeating-linear-gradient(135deg,var(--err-bg) 0 5px,
var(--err-bg2) 5px 10px)}
.chip.s-na{border-left-color:var(--line);background:#fff;color:var(--muted)}
.sw{display:inline-block;width:12px;height:12px;border:1px solid var(--line);border-left-width:3px;
vertical-align:-2px;margin-right:5px}
.sw.s-pass{background:var(--pass-bg);border-left-color:var(--pass)}
.sw.s-fail{background:var(--fail-bg);border-left-color:var(--fail)}
.sw.known{background:repeating-linear-gradient(135deg,var(--fail-bg) 0 3px,var(--fail-bg2) 3px 6px);
border-left:3px dashed var(--fail)}
.sw.s-partial{background:var(--part-bg);border-left-color:var(--part)}
.sw.s-error{background:repeating-linear-gradient(135deg,var(--err-bg) 0 3px,#d0d7de 3px 5px);
border-left-color:var(--err)}
.sw.s-na{background:#fff}
.tools{display:flex;gap:6px;align-items:center;color:var(--muted)}
.tools button,.tools select{font:inherit;font-size:12px;padding:1px 8px;border:1px solid var(--line);
border-radius:4px;background:#fff;color:var(--fg);cursor:pointer}
.changes{border:1px solid var(--line);border-radius:6px;padding:6px 12px;margin:10px 0;background:var(--soft)}
.changes>summary{cursor:pointer;font-weight:600}
.changes ul{margin:6px 0 2px;padding-left:0;list-style:none}
.changes li{padding:2px 0;display:flex;gap:8px;align-items:baseline;white-space:nowrap}
.changes .why{color:var(--muted);flex:1 1 0;min-width:8rem;overflow:hidden;text-overflow:ellipsis}
.scroll{overflow-x:auto;border:1px solid var(--line);border-radius:6px;max-width:100%}
table.grid{border-collapse:separate;border-spacing:0;min-width:100%}
table.grid th,table.grid td{border-right:1px solid var(--line);border-bottom:1px solid var(--line);
padding:5px 8px;text-align:left;vertical-align:top}
table.grid tr>:last-child{border-right:0}table.grid tbody tr:last-child>*{border-bottom:0}
table.grid thead th{background:var(--soft);font-weight:600;white-space:nowrap;font-size:12px}
table.grid thead th .ax,table.grid .corner .ax{color:var(--muted);font-weight:400;margin-right:4px}
table.grid .corner{vertical-align:bottom}
table.grid tbody th{background:var(--soft);white-space:nowrap;position:sticky;left:0;z-index:1;
font-family:var(--mono);font-weight:600}
td.cell{min-width:9.5rem;max-width:15rem;background:#fff;border-left:3px solid transparent}
td.cell:has(>details[open]){max-width:none}
td.cell .st{font-weight:600;white-space:nowrap}
td.cell .line{display:flex;align-items:center;gap:5px;flex-wrap:wrap}
td.cell .why{display:-webkit-box;-webkit-line-clamp:3;-webkit-box-orient:vertical;overflow:hidden;
overflow-wrap:anywhere;font-size:12px;margin-top:2px}
td.cell .why b{font-weight:600}
td.cell .warns{display:-webkit-box;-webkit-line-clamp:2;-webkit-box-orient:vertical;overflow:hidden;
overflow-wrap:anywhere;font-size:11px;margin-top:3px;color:var(--muted)}
td.cell summary{cursor:pointer;list-style:none}td.cell summary::-webkit-details-marker{display:none}
td.cell summary::marker{content:""}
td.cell summary:focus-visible{outline:2px solid #0969da;outline-offset:2px}
td.s-pass{background:var(--pass-bg);border-left-color:var(--pass)}td.s-pass .st{color:var(--pass)}
td.s-fail{background:var(--fail-bg);border-left-color:var(--fail)}td.s-fail .st{color:var(--fail)}
td.s-fail.known{background:repeating-linear-gradient(135deg,var(--fail-bg) 0 6px,var(--fail-bg2) 6px 12px);
border-left-style:dashed}
td.s-partial{background:var(--part-bg);border-left-color:var(--part)}td.s-partial .st{color:var(--part)}
td.s-error{background:repeating-linear-gradient(135deg,var(--err-bg) 0 6px,var(--err-bg2) 6px 12px);
border-left-color:var(--err)}td.s-error .st{color:var(--err)}
td.s-na{color:#8c959f}td.s-na .st{font-weight:400}
td.s-none{color:#8c959f;background:#fff}
.tag{font-size:10.5px;line-height:1;padding:2px 5px;border-radius:9px;border:1px solid currentColor;
text-transform:uppercase;letter-spacing:.3px;white-space:nowrap;font-weight:600}
.tag.known{color:var(--fail);border-style:dashed;background:#fff}
.tag.shipped{color:#0a5c36;background:#fff}
.tag.forced{color:#9a6700;border-style:dotted;background:#fff}
.tag.older{color:#57606a;border-style:dashed;background:#fff}
.answers ul{margin:4px 0 12px 18px;padding:0}
.tag.unexpected{color:#fff;background:#8250df;border-color:#8250df}
.tag.chg{color:#fff;border-color:transparent}
.chg-newly-red{background:var(--fail)!important}.chg-newly-green{background:var(--pass)!important}
.chg-reason,.chg-state{background:#8250df!important}.chg-new,.chg-removed{background:#0969da!important}
.figs{display:flex;flex-wrap:wrap;gap:0 8px;margin-top:3px;font-size:11.5px;line-height:1.35;
color:var(--muted)}
.figs span{display:inline-flex;gap:3px;align-items:center;white-space:nowrap}
.figs b{color:var(--fg);font-variant-numeric:tabular-nums}
svg.spark{vertical-align:middle;color:#0969da;overflow:visible}
.panel{width:min(44rem,80vw);margin-top:6px;padding:8px 10px;background:#fff;border:1px solid var(--line);
border-radius:6px;color:var(--fg);font-size:12px;white-space:normal}
.panel h4{margin:8px 0 3px;font-size:12px}
.panel p{margin:3px 0}
.panel .muted,.muted{color:var(--muted)}
table.stages{border-collapse:collapse;width:100%;margin:4px 0}
table.stages th,table.stages td{border-bottom:1px solid var(--line);padding:2px 6px;text-align:left;
vertical-align:top}
table.stages th{font-weight:600;color:var(--muted)}
table.stages td.secs{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.stages td.reason{overflow-wrap:anywhere}
.ss-pass{color:var(--pass)}.ss-warn{color:var(--part)}.ss-fail{color:var(--fail)}.ss-error{color:var(--err)}
.ss-skip{color:var(--muted)}
pre{margin:3px 0;padding:6px 8px;background:var(--soft);border:1px solid var(--line);border-radius:4px;
white-space:pre-wrap;overflow-wrap:anywhere;max-height:18rem;overflow:auto}
dl.details{margin:2px 0 6px;display:grid;grid-template-columns:max-content 1fr;gap:2px 10px}
dl.details dt{font-weight:600;color:var(--muted)}dl.details dd{margin:0;min-width:0;overflow-wrap:anywhere}
dl.details ul{margin:0;padding-left:16px}
details.sub{margin:4px 0}details.sub>summary{cursor:pointer;color:#0969da}
.legend{display:flex;flex-wrap:wrap;align-items:center;gap:4px 16px;color:var(--muted);margin:6px 0 0;
font-size:12px}
table.runs{border-collapse:collapse;width:100%}
table.runs th,table.runs td{border-bottom:1px solid var(--line);padding:5px 8px;text-align:left;
vertical-align:top}
table.runs th{background:var(--soft);font-weight:600}
footer{color:var(--muted);font-size:12px;margin-top:20px}
body[data-focus=problems] td.cell.s-pass,body[data-focus=problems] td.cell.s-na,
body[data-focus=red] td.cell:not(.s-fail),body[data-focus=changed] td.cell:not(.changed){opacity:.28}
@media (max-width:700px){main{padding:10px}header.top{padding:8px 10px}}
"""

# No data is ever interpolated into this script: it only toggles what is already on the page.
JS = """
(function(){
  var tools=document.getElementById('tools');if(!tools)return;tools.hidden=false;
  function all(open){document.querySelectorAll('td.cell details').forEach(function(d){d.open=open;});}
  document.getElementById('expand-all').addEventListener('click',function(){all(true);});
  document.getElementById('collapse-all').addEventListener('click',function(){all(false);});
  var focus=document.getElementById('focus');
  focus.addEventListener('change',function(){document.body.setAttribute('data-focus',focus.value);});
  function openHash(){
    var id=decodeURIComponent(location.hash.slice(1));var el=id&&document.getElementById(id);
    var d=el&&el.querySelector('details');if(d)d.open=true;
  }
  window.addEventListener('hashchange',openHash);openHash();
})();
"""

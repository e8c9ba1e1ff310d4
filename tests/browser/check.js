// Opens pgbelow's HTML pages in Debian's chromium (playwright-core) and
// prints what tests/html_browser.rs asserts, as one JSON document on
// stdout: every request, console error, page error and CSP violation; the
// size of each data-chart element; per flame graph its width, whether
// inferno's search matched and its zoom took; the finding ids on the page;
// and whether an injected payload ran.
//
//   node check.js CONFIG.json
//   CONFIG: {"chromium": "/usr/bin/chromium", "width": 1400,
//            "pages": [{"path": "/abs/page.html", "screenshot": "/abs/x.png"}]}
"use strict";
const fs = require("fs");
const url = require("url");

let chromium;
try {
  ({ chromium } = require("playwright-core"));
} catch (e) {
  console.error("tests/browser: playwright-core is not installed: run `npm ci --prefix tests/browser` (scripts/setup does)");
  process.exit(3);
}

async function flameChecks(page, el) {
  // A query's flame graphs wait in a closed <details>: opened as a user
  // does, by clicking its summary.
  const summary = await el.evaluateHandle((e) => {
    const d = e.closest("details");
    return d && !d.open ? d.querySelector("summary") : null;
  });
  const opened = summary.asElement() ? (await summary.asElement().click(), true) : false;
  if (opened) await el.evaluate((e) => new Promise((ok) => {
    if (!e.hasAttribute("data-src")) return ok();
    setTimeout(ok, 2000);
  }));
  // Lazy frames load when scrolled near.
  await el.scrollIntoViewIfNeeded();
  const frame = await el.contentFrame();
  await frame.waitForFunction(() => document.readyState === "complete" && document.getElementById("frames"));
  await frame.waitForTimeout(50);
  const out = { name: await el.getAttribute("data-chart"), opened };
  const box = await el.boundingBox();
  out.width = box ? box.width : 0;
  out.height = box ? box.height : 0;
  const info = await frame.evaluate(() => {
    const svg = document.documentElement;
    const r = svg.getBoundingClientRect();
    const frames = document.querySelectorAll("#frames > g");
    // The widest frame below the root that is not the whole graph.
    let pick = null, best = 0;
    frames.forEach((g) => {
      const rect = g.querySelector("rect");
      const w = rect ? rect.getBoundingClientRect().width : 0;
      if (w < r.width * 0.95 && w > best) { best = w; pick = g; }
    });
    let term = null;
    if (pick) {
      pick.setAttribute("data-test-pick", "1");
      const t = pick.querySelector("title").textContent;
      term = t.replace(/ \(.*$/, "");
    }
    return { svg_width: r.width, svg_height: r.height, frames: frames.length, term };
  });
  Object.assign(out, info);
  if (info.term) {
    page.once("dialog", (d) => d.accept(info.term));
    await frame.click("#search", { force: true });
    await frame.waitForTimeout(100);
    out.matched = await frame.evaluate(() => document.getElementById("matched").textContent);
    await frame.click("[data-test-pick]", { force: true });
    await frame.waitForTimeout(100);
    out.zoomed = await frame.evaluate(() => !document.getElementById("unzoom").classList.contains("hide"));
  }
  return out;
}

async function check(browser, cfg, p) {
  const context = await browser.newContext({ viewport: { width: cfg.width || 1400, height: 900 } });
  const page = await context.newPage();
  const res = { path: p.path, requests: [], console_errors: [], page_errors: [], dialogs: [] };
  page.on("request", (r) => res.requests.push(r.url()));
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") res.console_errors.push(m.text()); });
  page.on("pageerror", (e) => res.page_errors.push(String(e)));
  const t0 = Date.now();
  await page.goto(url.pathToFileURL(p.path).href, { waitUntil: "load" });
  res.load_ms = Date.now() - t0;
  res.xss = await page.evaluate(() => window.__xss === undefined ? null : String(window.__xss));
  res.charts_drawn = await page.evaluate(() => document.documentElement.getAttribute("data-charts-drawn"));
  res.first_chart_ms = await page.evaluate(() => {
    const m = performance.getEntriesByName("pgbelow-first-chart")[0];
    return m ? m.startTime : null;
  });
  res.charts = await page.$$eval(".chart[data-chart]", (els) => els.map((e) => {
    const c = e.querySelector("canvas");
    const r = (c || e).getBoundingClientRect();
    return { name: e.getAttribute("data-chart"), width: r.width, height: r.height, canvas: !!c };
  }));
  res.not_recorded = await page.$$eval("[data-not-recorded]", (els) => els.map((e) => e.getAttribute("data-not-recorded")));
  res.findings = await page.$$eval("[data-finding]", (els) => els.map((e) => e.getAttribute("data-finding")));
  res.body_text = await page.evaluate(() => document.body.innerText);
  res.text_content = await page.evaluate(() => document.body.textContent);
  // Any dialog before the flame graphs' search prompt is a payload's.
  let searching = false;
  page.on("dialog", (d) => { if (!searching) { res.dialogs.push(d.message()); d.dismiss(); } });
  // Selecting a finding with a window marks it.
  const card = await page.$(".finding[data-window]");
  if (card) {
    await card.click({ position: { x: 20, y: 10 } });
    res.selected = await page.$$eval(".finding.selected", (els) => els.map((e) => e.getAttribute("data-finding")));
  }
  res.flames = [];
  searching = true;
  for (const el of await page.$$("iframe[data-chart]")) {
    res.flames.push(await flameChecks(page, el));
  }
  if (p.screenshot) {
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: p.screenshot, fullPage: true });
  }
  await page.waitForTimeout(100);
  await context.close();
  return res;
}

(async () => {
  const cfg = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  const browser = await chromium.launch({
    executablePath: cfg.chromium || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu"],
  });
  const out = [];
  try {
    for (const p of cfg.pages) out.push(await check(browser, cfg, p));
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(out, null, 1) + "\n");
})().catch((e) => { console.error("tests/browser: " + (e && e.stack || e)); process.exit(1); });

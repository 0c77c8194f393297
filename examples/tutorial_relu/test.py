import torch
import myrelu

x = torch.randn(10, device="cuda")
y = myrelu.relu(x)

print("x:", x)
print("y:", y)
print("correct:", torch.allclose(y, torch.relu(x)))

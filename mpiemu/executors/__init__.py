"""Who charges an op on the device a rank plays: the GPU executor (op by op) and the Sunway
executor (a layer's pass as one SwFormer CG schedule), chosen by device kind."""

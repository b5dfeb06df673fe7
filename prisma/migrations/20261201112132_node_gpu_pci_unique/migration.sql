-- CreateIndex
CREATE UNIQUE INDEX "node_gpus_node_id_pci_address_key" ON "node_gpus"("node_id", "pci_address");
